"""`python -m specdec`: the CLI (`specdec up | generate | demo | bench`)."""

from specdec.cli import main

main()
