"""`python -m coordinator --port N --target HOST:PORT --draft HOST:PORT ...`"""

from coordinator.server import main

main()
