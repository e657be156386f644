"""Token windows (`TokenLoader`), one mode a workload:

python3 bench/tokens.py MODE [ARGS...]   (MODE --help for its arguments)"""

from lib.modes import dispatch

MODES = {
    "nanogpt": ("lib.tokens_nanogpt", "against nanoGPT's get_batch, and a GPT training loop"),
    "store": ("lib.store_tokens", "random windows from a loopback S3 server, beside boto3"),
    "mixture": ("lib.tokens_mixture", "a 0.5/0.3/0.2 three-source mixture against one source"),
    "text": ("lib.tokens_text", "Parquet text tokenized on the readers, beside `datasets`"),
    "fixtures": ("lib.tokens_fixtures", "megatron-core datasets for the Rust tests"),
}

if __name__ == "__main__":
    dispatch(__doc__, MODES)
