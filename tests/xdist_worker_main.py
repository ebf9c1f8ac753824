"""The `__main__` file a pytest-xdist worker is given (tests/conftest.py): it does nothing, so a
process the tests start with multiprocessing's spawn, which runs its parent's main file, starts
clean."""
