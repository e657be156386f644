"""pinfeed under Lightning's Trainer and torchdata's Stateful protocol: a run killed mid-epoch
and resumed from its checkpoint sees exactly the batches of an uninterrupted run. On the host
backend here; the same tests on CUDA are marked gpu."""

import numpy as np
import pytest

import pinfeed

torch = pytest.importorskip("torch")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
RECORDS, BATCH = 230, 16  # 15 batches an epoch, the last one partial


def ids_source():
    """Records whose first column is their index, so a batch names the records it holds."""
    x = np.zeros((RECORDS, 4), np.float32)
    x[:, 0] = np.arange(RECORDS)
    return x


def check_device(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def make_loader(device, **kw):
    return pinfeed.Loader(
        ids_source(), BATCH, device=device, shuffle=True, seed=4, framework="torch", **kw
    )


class Crash(Exception):
    pass


@pytest.mark.parametrize("device", DEVICES)
def test_lightning_resumes_mid_epoch_with_the_batches_not_trained_on(tmp_path, device):
    pl = pytest.importorskip("lightning.pytorch")
    check_device(device)

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return make_loader(device)

    class Model(pl.LightningModule):
        def __init__(self, crash_at=None):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))
            self.crash_at = crash_at
            self.seen = []

        def training_step(self, batch, batch_idx):
            assert batch.device.type == device
            if self.global_step == self.crash_at:
                raise Crash(f"killed at step {self.global_step}")
            self.seen.append(batch[:, 0].long().tolist())
            return (batch * self.w).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def trainer(**kw):
        return pl.Trainer(
            max_epochs=2,
            accelerator="gpu" if device == "cuda" else "cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            **kw,
        )

    whole = Model()
    trainer(enable_checkpointing=False).fit(whole, Data())
    assert len(whole.seen) == 30  # 2 epochs of 15

    # Checkpoints every 4 steps; killed by an exception at step 10 of the first epoch (one
    # batch already taken from the loader but never trained on).
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}"
    )
    crashed = Model(crash_at=10)
    with pytest.raises(Crash):
        trainer(callbacks=[ckpt]).fit(crashed, Data())
    saved = tmp_path / "ckpt" / "step=8.ckpt"
    assert saved.exists(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    state = torch.load(saved, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    assert state["combined_loader"][0]["batches_done"] == 8

    resumed = Model()
    trainer().fit(resumed, Data(), ckpt_path=saved)
    assert crashed.seen[:8] + resumed.seen == whole.seen


@pytest.mark.parametrize("device", DEVICES)
def test_loader_follows_torchdata_stateful_protocol(device):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    check_device(device)

    def train(loader, steps):
        """Code written for a StatefulDataLoader: takes ``steps`` batches, then checkpoints."""
        seen = []
        for batch in loader:
            seen.append(batch[:, 0].long().tolist())
            if len(seen) == steps:
                return seen, loader.state_dict()
        return seen, loader.state_dict()

    assert isinstance(make_loader(device), stateful.Stateful)
    whole, _ = train(make_loader(device, epochs=2), None)
    first, state = train(make_loader(device, epochs=2), 11)
    resumed = make_loader(device, epochs=2)
    resumed.load_state_dict(state)
    rest, _ = train(resumed, None)
    assert first + rest == whole


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [0, 2])
def test_prefetch_passes_a_stateful_dataloaders_state_through(device, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    check_device(device)
    data = torch.arange(RECORDS, dtype=torch.float32)[:, None].repeat(1, 3)

    def make():
        return stateful.StatefulDataLoader(
            data,
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            # Not fork: this process may run JAX's or pinfeed's threads from other tests.
            multiprocessing_context="spawn" if workers else None,
            generator=torch.Generator().manual_seed(7),
        )

    whole = [
        b[:, 0].long().tolist() for b in pinfeed.prefetch(make(), device=device, framework="torch")
    ]
    p = pinfeed.prefetch(make(), device=device, prefetch=3, framework="torch")
    assert isinstance(p, stateful.Stateful)
    first = [next(p)[:, 0].long().tolist() for _ in range(6)]
    state = p.state_dict()
    p.close()
    # The state is the loader's after the 6 batches received, not after those read ahead:
    # a StatefulDataLoader resumed from it yields exactly the rest.
    plain = make()
    plain.load_state_dict(state)
    assert first + [b[:, 0].long().tolist() for b in plain] == whole
    again = pinfeed.prefetch(make(), device=device, framework="torch")
    again.load_state_dict(state)
    rest = [b[:, 0].long().tolist() for b in again]
    assert first + rest == whole
    assert all(
        b.device.type == device for b in pinfeed.prefetch(make(), device=device, framework="torch")
    )
