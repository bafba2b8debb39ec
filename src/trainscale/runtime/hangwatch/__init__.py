"""The hang watch: each rank's heartbeat (heartbeat.py) publishes its progress and its flight records
(ledger.py); one Watch given the heartbeat (watch.py) names a hung or desynced rank (verdict.py), and peers.py
relays the first diagnosis."""
