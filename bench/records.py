"""Records (`Loader`, `to_device`, `prefetch`) on the GPU machine, one mode a workload:

    python3 bench/records.py MODE [ARGS...]   (MODE --help for its arguments)

bench/gpu_run.sh runs these in its sections; docs/BENCHMARKS.md gives each table's command."""

from lib.modes import dispatch

MODES = {
    "torch": ("lib.torch_baselines", "torch's seed-tensor variants, a torch ring, DataLoaders"),
    "python": ("lib.python_bench", "the Python API beside torch (PYBENCH sections)"),
    "ab": ("lib.ab", "builds in turns: to_device, Loader in order/shuffled, 1 MiB batches"),
    "threads": ("lib.threads_sweep", "the rows of `ab` at several reader counts"),
    "pipeline": ("lib.pipeline", "where a Loader's epoch goes, from its own account"),
    "handover": ("lib.handover", "the consumer's hand-over of a 1 MiB batch, step by step"),
    "big": ("lib.big_loader", "the Python Loader over the 40 GB file"),
    "torchrun": ("lib.torchrun_shards", "two ranks' shards (run under torchrun)"),
    "soak": ("lib.legacy_soak", "the Loader on torch's default stream, every byte checked"),
    "jax": ("lib.jax_feed", "a jitted step fed by device_put and by framework='jax'"),
    "store": ("lib.store_bench", ".npy shards from a loopback S3 server"),
    "parquet": ("lib.records_parquet", "Parquet float32 columns against the same bytes as .npy"),
    "report": ("lib.report", "a run's $OUT as one JSON, a plot and Markdown tables"),
}

if __name__ == "__main__":
    dispatch(__doc__, MODES)
