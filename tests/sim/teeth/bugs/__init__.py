"""One reintroduced bug per file, constants only (the format is in ``../catalogue.py``).
The files are read with ``ast``, never imported."""
