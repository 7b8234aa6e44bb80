"""What the test modules share, none of it a test or a fixture: the daemon under test and its
requests (daemon.py), the real servers' settings and rows (servers.py, databases.py), the gates
that skip a test when this machine lacks what it needs (skips.py), the embedded stores composed
for unit tests (embedded.py), private server processes and their faults (faults.py,
topologies.py, galera.py, replication.py, nginx.py, local_servers.py), and the pieces several test
modules drive the daemon with. tests/conftest.py holds the fixtures, built from these; test modules
import from here, never from conftest.py or from one another. Importing any of these starts
nothing.
"""
