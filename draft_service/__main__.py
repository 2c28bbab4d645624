from specdec.draft_service.server import main

main()
