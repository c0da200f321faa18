"""Test-suite root. Under pytest's default import mode this folder goes on sys.path, so test
modules in any subfolder can import the shared helpers beside this file (tiny_model.py)."""
