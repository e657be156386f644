"""The step time of a real model fed by a peer, against the same model fed one batch already on the
GPU (its bound), in the peer's process: nanoGPT's GPT for tokens (6 layers, 384 wide, bf16
autocast), torchvision's resnet50 for images (channels-last, bf16 autocast), a small CNN for
records. CUDA only."""

import time


def small_cnn(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def model_for(a, torch):
    """(model, loss of a delivered batch) for the workload."""
    dev = a.device
    if a.workload == "tokens":
        from lib.nanogpt_model import GPT, GPTConfig

        cfg = GPTConfig(
            block_size=a.seq,
            vocab_size=50304,
            n_layer=6,
            n_head=6,
            n_embd=384,
            dropout=0.0,
            bias=False,
        )
        model = GPT(cfg).to(dev)
        # int64 and contiguous: nanoGPT's loss views the targets (a peer's y may be a slice).
        return model, lambda b: model(b[0].long().contiguous(), b[1].long().contiguous())[1]
    if a.workload == "images":
        import torchvision

        model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
        mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

        def loss(b):
            x = ((b[0].float() - mean) / std).contiguous(memory_format=torch.channels_last)
            return torch.nn.functional.cross_entropy(model(x), b[1] % 1000)

        return model, loss
    model = small_cnn(torch).to(dev)
    labels = {}

    def loss(b):
        x = b[0] if isinstance(b, (tuple, list)) else b
        y = labels.setdefault(len(x), torch.randint(0, 10, (len(x),), device=dev))
        return torch.nn.functional.cross_entropy(model(x.float() / 255), y)

    return model, loss


def _steps(batches, model, loss, steps, warm, torch):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)

    def step():
        with ctx:
            out = loss(next(batches))
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / steps


def step_time(a, peer):
    """ms a step fed by the peer, and fed its first batch again and again (the bound)."""
    import torch

    from lib.peers_measure import to_device

    if not a.device.startswith("cuda"):
        return {"model": "skipped: the model runs on a CUDA device only"}
    if a.workload == "tokens" and a.batch * a.seq > 16 * 1024:
        # nanoGPT's logits are B x T x 50304: 26 GB in bf16 at 64 x 4096, and as much again in
        # float32 for the loss; its training micro-batches are 12 x 1024.
        return {"model": f"skipped: GPT steps at 12 x 1024, not {a.batch} x {a.seq}"}
    deliver = peer.deliver or to_device
    torch.manual_seed(0)
    model, loss = model_for(a, torch)
    it = peer.batches()
    fed = (deliver(b, a.device) for b in it)
    ms = _steps(fed, model, loss, a.model_steps, 5, torch)
    one = deliver(next(it), a.device)
    bound = _steps(iter(lambda: one, None), model, loss, a.model_steps, 5, torch)
    return {
        "model_ms_per_step": ms,
        "bound_ms_per_step": bound,
        "over_bound_pct": 100 * (ms / bound - 1),
    }
