"""`python -m h3plan ...`: see h3plan/cli.py."""

from h3plan.cli import main

if __name__ == "__main__":
    main()
