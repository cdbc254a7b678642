"""The ``shardwise`` command: a thin argparse shell over library calls."""
