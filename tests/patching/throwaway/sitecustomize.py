"""Run at start-up by a child interpreter of tests/patching/test_throwaway_patch.py (this folder first on its
PYTHONPATH): the temporary register, holding the throw-away patch alone, before anything reads the register."""
import throwaway_register

throwaway_register.install()
