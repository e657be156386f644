"""pinfeed against its peers on their own ground (issue 52), one mode a part:

python3 bench/peers.py MODE [ARGS...]   (MODE --help for its arguments)"""

from lib.modes import dispatch

MODES = {
    "run": ("lib.peers_run", "every peer on tokens, images and records, in turns: the table"),
    "one": ("lib.peers_one", "one peer on one workload in this process (run starts these)"),
    "noisy": ("lib.peers_noisy", "a launch-bound model fed by pinfeed and by a resident batch"),
}

if __name__ == "__main__":
    dispatch(__doc__, MODES)
