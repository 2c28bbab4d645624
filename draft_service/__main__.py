from draft_service.server import main

main()
