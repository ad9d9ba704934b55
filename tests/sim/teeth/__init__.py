"""The catalogue of reintroduced bugs: mutation testing of the search (``python -m tests.sim
teeth``).

A "0 failed" from the simulation is only as good as the search behind it. Every
exactly-once hole found so far has one file in ``bugs/`` holding a small patch that brings
it back on today's code and the search that must find it (the simulation with some flags,
or, for a bug the simulation cannot reach, a pytest node that must fail). The runner
applies each patch to a scratch copy of the working tree, runs that search there, and
reports per bug whether it was found and after how many seeds. Models: FoundationDB's
buggify, TigerBeetle's VOPR.

``catalogue.py`` reads the bug files (constants only, never executed) and checks that
every patch still applies; ``runner.py`` makes the scratch copies and runs the searches;
``test_teeth.py`` (next to the simulation's tests) is the CI short form."""
