from specdec.target_service.server import main

main()
