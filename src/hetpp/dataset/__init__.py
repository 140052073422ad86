"""Token datasets: `hetpp data prepare` writes them (prepare.py), training reads shards.py."""
