"""One module per system in the comparison. Each has a ``System`` class (start the
server on 127.0.0.1, its process ids for CPU/RSS, ``prepare`` a clean target for a run and
return the picklable config the producers get, ``stop``) and a module-level ``produce``
function, the body of one producer process (see ``bench/runner.py``)."""
