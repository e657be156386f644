"""Object storage: shards uploaded with boto3 to a real S3-compatible server on 127.0.0.1 (moto
and SeaweedFS, each started and stopped here), read back byte-exact in order, shuffled, across
ranks, with resume, through faults, and through the local cache.

Records hold their own global index in their first element, so every batch says which records
it holds; the same shards are also written to local disk, and the two Loaders must agree batch
for batch.
"""

import io
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from s3_server import (
    SECRET,
    SERVERS,
    FaultProxy,
    Moto,
    Seaweed,
    indexed_records,
    options,
    s3_client,
    start_server,
)

import pinfeed

BUCKET = "pinfeed-data"
SHARDS = 3
PER_SHARD = 700
WIDTH = 33  # uint32 elements a record: 132 bytes
BATCH = 50

pytestmark = pytest.mark.usefixtures("no_launcher_env")


def shard(i):
    return indexed_records(i * PER_SHARD, PER_SHARD, WIDTH)


ALL = np.concatenate([shard(i) for i in range(SHARDS)])


def upload(s3, bucket=BUCKET):
    s3.create_bucket(Bucket=bucket)
    for i in range(SHARDS):
        buf = io.BytesIO()
        np.save(buf, shard(i))
        s3.put_object(Bucket=bucket, Key=f"train/part-{i:03d}.npy", Body=buf.getvalue())
    s3.put_object(Bucket=bucket, Key="train/readme.txt", Body=b"not a shard")
    s3.put_object(Bucket=bucket, Key="raw/records.bin", Body=ALL.tobytes())


@pytest.fixture(scope="module", params=SERVERS)
def server(request):
    """Each test that takes it runs against both servers (:func:`s3_server.start_server`)."""
    up = start_server(request.param)
    upload(s3_client(up.endpoint, secret=SECRET))
    yield up
    up.stop()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    for i in range(SHARDS):
        np.save(d / f"part-{i:03d}.npy", shard(i))
    return d


def loader(url, endpoint, store=None, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("pinned_budget", "256KiB")
    kw.setdefault("num_threads", 2)
    return pinfeed.Loader(url, BATCH, storage_options=options(endpoint, **(store or {})), **kw)


def batches(it):
    return [np.array(b, copy=True) for b in it]


def test_a_prefix_a_glob_an_object_and_raw_records_read_back_byte_exact(server):
    url = f"s3://{BUCKET}/train/"
    got = np.concatenate(batches(loader(url, server.endpoint)))
    assert np.array_equal(got, ALL)
    glob = f"s3://{BUCKET}/train/part-00[12].npy"
    assert np.array_equal(np.concatenate(batches(loader(glob, server.endpoint))), ALL[PER_SHARD:])
    one = f"s3://{BUCKET}/train/part-001.npy"
    assert np.array_equal(
        np.concatenate(batches(loader(one, server.endpoint))), ALL[PER_SHARD : 2 * PER_SHARD]
    )
    raw = loader(f"s3://{BUCKET}/raw/records.bin", server.endpoint, dtype="<u4", shape=[WIDTH])
    assert np.array_equal(np.concatenate(batches(raw)), ALL)


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_shuffled_epochs_equal_the_same_shards_on_local_disk(server, local, shuffle):
    url = f"s3://{BUCKET}/train/"
    kw = dict(shuffle=shuffle, seed=5)
    if shuffle == "block":
        kw.update(block_size=16, block_window=4)
    remote = loader(url, server.endpoint, **kw)
    here = pinfeed.Loader(str(local), BATCH, device="cpu", pinned_budget="256KiB", **kw)
    for epoch in range(2):
        remote.set_epoch(epoch)
        here.set_epoch(epoch)
        got, want = batches(remote), batches(here)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert np.array_equal(g, w)
        ids = np.sort(np.concatenate(got)[:, 0])
        assert np.array_equal(ids, np.arange(len(ALL)))
        assert np.array_equal(np.concatenate(got), ALL[np.concatenate(got)[:, 0]])


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_the_epoch_and_resume_exactly(server, world):
    url = f"s3://{BUCKET}/train/"
    seen = []
    for rank in range(world):
        kw = dict(shuffle=True, seed=9, rank=rank, world_size=world)
        first = loader(url, server.endpoint, **kw)
        it = iter(first)
        head = [np.array(next(it), copy=True) for _ in range(3)]
        state = first.state_dict()
        first.close()
        resumed = loader(url, server.endpoint, **kw)
        resumed.load_state_dict(state)
        rest = batches(resumed)
        whole = batches(loader(url, server.endpoint, **kw))
        assert len(head) + len(rest) == len(whole)
        for g, w in zip(head + rest, whole):
            assert np.array_equal(g, w)
        seen.append(np.concatenate(whole)[:, 0])
    ids = np.concatenate(seen)
    # Every record once over the ranks (the last batches may be padded with repeats).
    assert set(ids.tolist()) == set(range(len(ALL)))
    assert len(ids) - len(ALL) < world


def test_stats_count_the_network_and_name_it(server):
    ld = loader(f"s3://{BUCKET}/train/", server.endpoint)
    batches(ld)
    s = ld.stats()
    net = s["network"]
    assert net["requests"] >= SHARDS and net["retries"] == 0
    assert net["bytes_fetched"] >= ALL.nbytes
    assert net["wait"] > 0
    assert s["reader_description"].startswith(f"object store s3://{BUCKET}")
    local = pinfeed.Loader(ALL, BATCH, device="cpu")
    batches(local)
    assert local.stats()["network"] is None


def test_503_slowdown_and_cut_bodies_are_retried_and_delivered_once(server):
    proxy = FaultProxy(server.port)
    try:
        ld = loader(f"s3://{BUCKET}/train/", proxy.endpoint, queue_depth=4)
        proxy.inject("503", "cut", "503", "cut", "cut", "503")
        got = np.concatenate(batches(ld))
        assert np.array_equal(got, ALL)
        assert proxy.injected == 6
        assert ld.stats()["network"]["retries"] == 6
    finally:
        proxy.close()


def test_connections_the_server_closed_while_the_readers_waited_cost_no_retry(server):
    # The consumer is slower than the readers, so they wait on full slots between reads; while
    # they wait, the server closes their idle connections. A read then opens new ones rather
    # than failing on a closed one and retrying.
    proxy = FaultProxy(server.port)
    try:
        ld = loader(f"s3://{BUCKET}/train/", proxy.endpoint, pinned_budget="64KiB", prefetch=1)
        got = []
        for b in ld:
            got.append(np.asarray(b).copy())
            if len(got) <= 8:
                time.sleep(0.2)  # the readers fill the freed slot and wait again
                proxy.close_idle()
                time.sleep(0.1)  # the closes reach the client before the next read
        assert np.array_equal(np.concatenate(got), ALL)
        assert proxy.idle_closed >= 8, proxy.idle_closed
        assert ld.stats()["network"]["retries"] == 0
    finally:
        proxy.close()


def test_a_range_that_keeps_failing_is_an_error_naming_object_and_range(server):
    proxy = FaultProxy(server.port)
    try:
        ld = loader(f"s3://{BUCKET}/train/part-002.npy", proxy.endpoint, store=dict(retries=2))
        proxy.always = "503"
        with pytest.raises(pinfeed.PinfeedError) as e:
            batches(ld)
        msg = str(e.value)
        assert isinstance(e.value, OSError)
        assert f"s3://{BUCKET}/train/part-002.npy" in msg and "at offset" in msg, msg
        assert "after 2 retries" in msg and "\n" not in msg, msg
        assert SECRET not in msg
        proxy.always = None
        ld = loader(f"s3://{BUCKET}/train/part-000.npy", proxy.endpoint, store=dict(retries=1))
        proxy.always = "cut"
        with pytest.raises(pinfeed.PinfeedError, match="after 1 retries"):
            batches(ld)
    finally:
        proxy.close()


def test_an_object_replaced_mid_epoch_is_an_error_not_a_mix_of_versions(server):
    s3 = s3_client(server.endpoint, secret=SECRET)
    key = "train/part-002.npy"
    original = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    ld = loader(f"s3://{BUCKET}/train/", server.endpoint, pinned_budget="64KiB", prefetch=1)
    it = iter(ld)
    next(it)  # the first shard's records: the third is read much later
    buf = io.BytesIO()
    np.save(buf, shard(2) + 1)  # the same size, other bytes
    s3.put_object(Bucket=BUCKET, Key=key, Body=buf.getvalue())
    try:
        with pytest.raises(pinfeed.PinfeedError) as e:
            batches(it)
        msg = str(e.value)
        assert "part-002.npy" in msg and "the object changed while it was read" in msg, msg
    finally:
        s3.put_object(Bucket=BUCKET, Key=key, Body=original)


def test_a_server_killed_mid_epoch_and_restarted_loses_nothing():
    moto = Moto()
    # The proxy passes everything through, and while `down` resets every connection: moto
    # keeps its objects in memory, so a restarted moto is "up" only once they are uploaded
    # again, as a restarted store would be with its disks.
    proxy = FaultProxy(moto.port)
    try:
        upload(s3_client(moto.endpoint))
        ld = loader(
            f"s3://{BUCKET}/train/",
            proxy.endpoint,
            store=dict(retries=30),
            pinned_budget="64KiB",
            prefetch=1,
        )
        it = iter(ld)
        got = [np.array(next(it), copy=True)]
        proxy.down = True
        moto.kill()

        def restart():
            time.sleep(1.0)
            moto.start()  # the same port
            upload(s3_client(moto.endpoint))
            proxy.down = False

        t = threading.Thread(target=restart)
        t.start()
        got += batches(it)
        t.join()
        assert np.array_equal(np.concatenate(got), ALL)
        assert ld.stats()["network"]["retries"] > 0
    finally:
        proxy.close()
        moto.stop()


def test_a_server_that_stops_answering_is_an_error_after_the_timeout(server):
    ld = loader(
        f"s3://{BUCKET}/train/",
        server.endpoint,
        store=dict(timeout="1s", read_timeout="1s", connect_timeout="1s", retries=1),
    )
    server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(pinfeed.PinfeedError) as e:
            batches(ld)
        assert time.monotonic() - start < 30
        assert f"s3://{BUCKET}/train/part-000.npy" in str(e.value)
    finally:
        server.resume()


def test_missing_objects_buckets_and_wrong_credentials_are_one_line_errors(server):
    cases = {
        f"s3://{BUCKET}/train/absent.npy": "absent.npy",
        "s3://no-such-bucket-here/train/": "no-such-bucket-here",
        f"s3://{BUCKET}/nothing-here/": ".parquet, .arrow or .jsonl object under this prefix",
        f"s3://{BUCKET}/train/zz-*.npy": "no object matches this pattern",
    }
    for url, words in cases.items():
        with pytest.raises(pinfeed.PinfeedError) as e:
            loader(url, server.endpoint)
        msg = str(e.value)
        assert words in msg and "\n" not in msg and SECRET not in msg, msg
    with pytest.raises(pinfeed.PinfeedError, match='storage option "colour"'):
        loader(f"s3://{BUCKET}/train/", server.endpoint, store=dict(colour="red"))
    with pytest.raises(pinfeed.PinfeedError, match="apply to object-storage URLs"):
        pinfeed.Loader(__file__, 4, device="cpu", storage_options={"region": "x"})


def test_wrong_credentials_are_refused_in_one_line():
    import boto3

    # Authentication is enforced after the first 5 actions, which set up a user and a key.
    moto = Moto(env={"INITIAL_NO_AUTH_ACTION_COUNT": "5"})
    try:
        kw = dict(endpoint_url=moto.endpoint, region_name="us-east-1")
        iam = boto3.client("iam", aws_access_key_id="x", aws_secret_access_key="y", **kw)
        iam.create_user(UserName="reader")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        upload(s3_client(moto.endpoint, key["AccessKeyId"], key["SecretAccessKey"]))
        good = dict(access_key_id=key["AccessKeyId"], secret_access_key=key["SecretAccessKey"])
        # One object: moto's signature check refuses object_store's signed listing requests.
        url = f"s3://{BUCKET}/train/part-001.npy"
        want = ALL[PER_SHARD : 2 * PER_SHARD]
        assert np.array_equal(np.concatenate(batches(loader(url, moto.endpoint, store=good))), want)
        for wrong in ({"secret_access_key": SECRET}, {"access_key_id": "AKIANOSUCHKEY000000"}):
            with pytest.raises(pinfeed.PinfeedError) as e:
                loader(url, moto.endpoint, store=dict(good, **wrong))
            msg = str(e.value)
            assert isinstance(e.value, OSError) and "403" in msg and "\n" not in msg, msg
            assert SECRET not in msg and key["SecretAccessKey"] not in msg, msg
    finally:
        moto.stop()


def test_seaweedfs_refuses_wrong_credentials_in_one_line():
    seaweed = Seaweed(key="reader", secret=SECRET)
    try:
        upload(s3_client(seaweed.endpoint, "reader", SECRET))
        good = dict(access_key_id="reader")
        url = f"s3://{BUCKET}/train/"  # a listing, signed, then ranged GETs
        got = batches(loader(url, seaweed.endpoint, store=good))
        assert np.array_equal(np.concatenate(got), ALL)
        for wrong in ({"secret_access_key": "not-the-secret"}, {"access_key_id": "nobody"}):
            with pytest.raises(pinfeed.PinfeedError) as e:
                loader(url, seaweed.endpoint, store=dict(good, **wrong))
            msg = str(e.value)
            assert isinstance(e.value, OSError) and "403" in msg and "\n" not in msg, msg
            assert SECRET not in msg and "not-the-secret" not in msg, msg
    finally:
        seaweed.stop()


ENTRY_POINT = [sys.executable, "-c", "from pinfeed._cli import main; main()"]


def run_cli(*args, env=None):
    return subprocess.run(
        [*ENTRY_POINT, *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=120,
    )


def cli_options(endpoint, secret=SECRET):
    pairs = options(endpoint, secret_access_key=secret)
    return [a for k, v in pairs.items() for a in ("--storage-option", f"{k}={v}")]


def test_credentials_never_appear_in_output_stats_or_json(server, tmp_path):
    env = {"AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ACCESS_KEY_ID": "test"}
    url = f"s3://{BUCKET}/train/"
    for extra in (["--json"], [], ["--verify"]):
        r = run_cli(
            "stream",
            url,
            "--batch-size",
            "64",
            "--device",
            "cpu",
            *extra,
            *cli_options(server.endpoint),
            env=env,
        )
        assert r.returncode == 0, r.stderr
        assert SECRET not in r.stdout + r.stderr
    report = json.loads(
        run_cli(
            "stream",
            url,
            "--batch-size",
            "64",
            "--device",
            "cpu",
            "--json",
            *cli_options(server.endpoint),
            env=env,
        ).stdout
    )
    assert report["network"]["requests"] > 0 and report["records"] == len(ALL)
    bad = run_cli(
        "stream",
        f"s3://{BUCKET}/train/absent.npy",
        "--batch-size",
        "64",
        "--device",
        "cpu",
        *cli_options(server.endpoint),
        env=env,
    )
    assert bad.returncode != 0 and "absent.npy" in bad.stderr
    assert SECRET not in bad.stdout + bad.stderr
    ld = loader(url, server.endpoint)
    batches(ld)
    assert SECRET not in repr(ld) + repr(ld.stats()) + repr(ld.state_dict())


def test_the_cache_serves_later_epochs_within_its_limit(server, tmp_path):
    url = f"s3://{BUCKET}/train/"
    cache = tmp_path / "cache"
    ld = loader(url, server.endpoint, cache_dir=cache, shuffle=True)
    # Each (small) object is one block, fetched whole and kept when its header was read at
    # open: no epoch sends a request.
    for epoch in range(2):
        ld.set_epoch(epoch)
        got = np.concatenate(batches(ld))
        assert np.array_equal(got, ALL[got[:, 0]])
        assert np.array_equal(np.sort(got[:, 0]), np.arange(len(ALL)))
        net = ld.stats()["network"]
        assert net["cache_hits"] > 0 and net["cache_misses"] == 0, net
        assert net["requests"] == 0 and net["bytes_fetched"] == 0, net
    files = [p for p in cache.iterdir() if ".part." not in p.name]
    assert len(files) == SHARDS  # one block per (small) object
    # A limit of two objects' worth: the cache never holds more, and reads stay exact.
    small = tmp_path / "small"
    limit = 2 * (ALL.nbytes // SHARDS + 256)
    ld = loader(url, server.endpoint, cache_dir=small, cache_limit=limit, shuffle=True)
    for _ in range(2):
        got = np.concatenate(batches(ld))
        assert np.array_equal(np.sort(got[:, 0]), np.arange(len(ALL)))
        assert sum(p.stat().st_size for p in small.iterdir()) <= limit


def test_a_cache_directory_deleted_mid_run_costs_only_the_caching(server, tmp_path):
    import shutil

    cache = tmp_path / "gone"
    url = f"s3://{BUCKET}/train/"
    ld = loader(url, server.endpoint, cache_dir=cache)
    it = iter(ld)
    got = [np.array(next(it), copy=True)]
    shutil.rmtree(cache)
    got += batches(it)
    assert np.array_equal(np.concatenate(got), ALL)
    # A cache path that cannot be a directory: every block is fetched and counted as an error.
    blocked = tmp_path / "file"
    blocked.write_bytes(b"")
    ld = loader(url, server.endpoint, cache_dir=blocked / "sub")
    assert np.array_equal(np.concatenate(batches(ld)), ALL)
    assert ld.stats()["network"]["cache_errors"] >= SHARDS


def test_two_processes_share_one_cache(server, tmp_path):
    cache = str(tmp_path / "shared")
    url = f"s3://{BUCKET}/train/"
    args = [
        "stream",
        url,
        "--batch-size",
        "64",
        "--device",
        "cpu",
        "--verify",
        "--epochs",
        "3",
        "--shuffle",
        "random",
        "--cache-dir",
        cache,
        "--cache-limit",
        "200KiB",
        *cli_options(server.endpoint),
    ]
    procs = [
        subprocess.Popen(
            [*ENTRY_POINT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "verified against the source" in out, out


def test_a_500_or_503_on_list_or_head_is_retried(server):
    # The open lists a prefix and HEADs one object; a single fault on either used to fail the
    # open. They follow the ranged GETs' retry policy.
    proxy = FaultProxy(server.port)
    try:
        proxy.inject_on("LIST", "503")
        ld = loader(f"s3://{BUCKET}/train/", proxy.endpoint)
        assert proxy.injected == 1
        assert np.array_equal(np.concatenate(batches(ld)), ALL)
        proxy.inject_on("HEAD", "503")
        one = loader(f"s3://{BUCKET}/train/part-001.npy", proxy.endpoint)
        assert proxy.injected == 2
        assert np.array_equal(np.concatenate(batches(one)), ALL[PER_SHARD : 2 * PER_SHARD])
    finally:
        proxy.close()


def test_a_body_shorter_than_its_content_length_keeps_the_bytes_that_arrived(server):
    # Each reply promises 100 bytes more than the range and the connection is cut after the
    # range's last byte: every byte asked for arrived, so nothing is asked again (pinfeed used
    # to retry an empty range until it gave up, 20 s later).
    proxy = FaultProxy(server.port)
    try:
        ld = loader(f"s3://{BUCKET}/train/", proxy.endpoint, queue_depth=4)
        proxy.inject(*["overstate"] * 6)
        started = time.monotonic()
        assert np.array_equal(np.concatenate(batches(ld)), ALL)
        assert proxy.injected == 6
        assert ld.stats()["network"]["retries"] == 0
        assert time.monotonic() - started < 10
    finally:
        proxy.close()


def test_a_listing_that_repeats_its_continuation_token_is_an_error_naming_the_prefix(server):
    if isinstance(server, Seaweed):
        pytest.skip("SeaweedFS checks signatures: the proxy cannot drop its token from a request")
    proxy = FaultProxy(server.port)
    proxy.endless = True
    outcome = []

    def open_it():
        try:
            loader(f"s3://{BUCKET}/train/", proxy.endpoint)
            outcome.append(None)
        except pinfeed.PinfeedError as e:
            outcome.append(e)

    try:
        opener = threading.Thread(target=open_it, daemon=True)
        opener.start()
        opener.join(60)
        assert outcome, "the constructor did not return: the listing never ended"
        e = outcome[0]
        assert e is not None, "a listing that never ends was accepted"
        msg = str(e)
        assert f"s3://{BUCKET}/train/" in msg and "continuation token" in msg, msg
        assert "\n" not in msg and SECRET not in msg, msg
    finally:
        proxy.close()
