"""`python -m meshscale` is the `meshscale` command (for checkouts used without installing)."""
from meshscale.cli import main

main()
