"""shardtrain.torch refuses misuse with a clear exception, and its step
lands the shards' parameters in the model in place."""

import pytest

from shardtrain import env

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
import shardtrain.torch as st  # noqa: E402 (after the skip)


@pytest.fixture
def settings(start_shards):
    cluster = start_shards(1, ["--mode=async", "--optimizer=sgd", "--lr=0.5"], num_workers=1)
    return env.Settings(servers=tuple(cluster.addresses), worker=0, num_workers=1, mode="async")


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def loss_of(m):
    return m(torch.ones(5, 4)).square().mean()


def test_step_applies_the_shards_update_in_place(settings):
    m = model()
    weight = m[0].weight
    before = weight.detach().clone()
    with st.DistributedOptimizer(m, settings=settings) as opt:
        loss = loss_of(m)
        loss.backward()
        grad = weight.grad.clone()
        opt.step(loss=loss)
        assert m[0].weight is weight  # the same tensor, new values
        torch.testing.assert_close(weight.detach(), before - 0.5 * grad)
        assert opt.clock == 1


def test_rejects_parameters_it_cannot_train(settings):
    with pytest.raises(TypeError, match="'0.weight' is torch.float64"):
        st.DistributedOptimizer(model().double(), settings=settings)
    frozen = model()
    frozen[0].bias.requires_grad_(False)
    with pytest.raises(ValueError, match="'0.bias' does not require grad"):
        st.DistributedOptimizer(frozen, settings=settings)
    strided = [("w", torch.nn.Parameter(torch.ones(4, 3)).t())]
    with pytest.raises(ValueError, match="'w' is not contiguous"):
        st.DistributedOptimizer(strided, settings=settings)
    with pytest.raises(TypeError, match="named_parameters"):
        st.DistributedOptimizer([torch.nn.Parameter(torch.ones(2))], settings=settings)


def test_without_shards_it_says_how_to_start_a_job():
    with pytest.raises(RuntimeError, match="SHARDTRAIN_SERVERS is not set"):
        st.DistributedOptimizer(model(), settings=env.Settings())


def test_refuses_steps_out_of_order(settings):
    m = model()
    with st.DistributedOptimizer(m, settings=settings) as opt:
        with pytest.raises(RuntimeError, match="step\\(\\) without backward\\(\\)"):
            opt.step()
        loss_of(m).backward()
        with pytest.raises(RuntimeError, match="zero_grad\\(\\) between backward\\(\\) and step"):
            opt.zero_grad()
        with pytest.raises(RuntimeError, match="call step\\(\\) after backward\\(\\)"):
            loss_of(m).backward()
        opt.step()
        opt.zero_grad()
    # Gradient accumulation over two passes is allowed when asked for. The
    # same worker index again: it resumes at the clock the shards recorded.
    m = model()
    with st.DistributedOptimizer(m, settings=settings, backward_passes_per_step=2) as opt:
        assert opt.first_step == 1
        loss_of(m).backward()
        loss_of(m).backward()
        opt.step()
        assert opt.clock == 2
