"""`python -m coordinator --port N --target HOST:PORT --draft HOST:PORT ...`"""

from specdec.coordinator.api.server import main

main()
