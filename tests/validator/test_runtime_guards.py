"""The runtime guards as pure functions over what one run observed, on CPU tensors (they stand in for CUDA
ones: the guards compare storage, dtypes and values, never launch anything)."""

from __future__ import annotations

import pytest
import torch

from dice.validator import runtime_guards as rg
from dice.validator.runtime_guards import Launch, Replaced, Trial, first_rejection, rejected


def trial(**changes) -> Trial:
    """An honest ReLU trial on the CPU; ``changes`` replace what the candidate did."""
    x = torch.rand(8) - 0.5
    fields = dict(
        inputs=[x, 3],
        saved=[x.clone(), 3],
        ref_mutated=[False, False],
        ref_aliases=False,
        ref_out=torch.relu(x),
        new_out=torch.relu(x),
        device_type="cpu",
        threads_before=1,
        threads_after=1,
        previous=None,
    )
    fields.update(changes)
    return Trial(**fields)


def test_honest_trial_passes_every_guard() -> None:
    t = trial()
    for guard in rg.RUNTIME_GUARDS:
        if guard.observes is Trial:
            assert guard.check(t) is None, guard.name
    assert first_rejection(t, where=" (trial 1)") is None


def test_the_table_keeps_the_order_of_the_checks() -> None:
    assert [g.name for g in rg.RUNTIME_GUARDS] == [
        "monkey_patch",
        "side_thread",
        "fake_tensor",
        "precision_downgrade",
        "output_aliases_input",
        "inputs_mutated",
        "outputs_cached",
        "kernel_never_called",
    ]


def test_rejected_is_the_one_message_format() -> None:
    v = rejected("side_thread", "the candidate started a thread", where=" (trial 2)")
    assert (v.status, v.compiled, v.correct) == ("rejected", True, None)
    assert v.message == "rejected by guard side_thread: the candidate started a thread (trial 2)"
    static = rejected("torch_fallback", "calls torch", where=" (line 4)", compiled=False)
    assert static.compiled is False and static.message.endswith("calls torch (line 4)")


def test_side_thread() -> None:
    v = first_rejection(trial(threads_after=2), where=" (trial 3)")
    assert v is not None
    assert v.message == "rejected by guard side_thread: the candidate started a thread (trial 3)"


def test_fake_tensor_meta_subclass_and_wrong_device() -> None:
    class Sub(torch.Tensor):
        pass

    x = torch.rand(8)
    assert rg.fake_tensor(trial(new_out=torch.empty(8, device="meta"))) == (
        "output is a meta tensor (must be a plain, materialised CUDA torch.Tensor)"
    )
    assert rg.fake_tensor(trial(new_out=x.as_subclass(Sub))).startswith("output is Sub ")
    assert rg.fake_tensor(trial(new_out=(x, x), device_type="cuda")).startswith("output is a cpu tensor")


def test_precision_downgrade() -> None:
    x = torch.rand(8)
    assert rg.precision_downgrade(trial(new_out=x.half(), ref_out=x)) == (
        "output is torch.float16, the reference's torch.float32"
    )
    assert rg.precision_downgrade(trial(new_out=x.bfloat16(), ref_out=x.half())) is not None  # same bits
    assert rg.precision_downgrade(trial(new_out=x.double(), ref_out=x)) is None
    assert rg.precision_downgrade(trial(new_out=x.long(), ref_out=x.int())) is None  # integer reference


def test_output_aliases_input() -> None:
    x = torch.rand(8)
    t = trial(inputs=[x], saved=[x.clone()], ref_mutated=[False], new_out=x[2:])
    assert rg.output_aliases_input(t) == "the output shares memory with an input, the reference's does not"
    assert rg.output_aliases_input(trial(inputs=[x], new_out=x, ref_aliases=True)) is None
    assert rg.output_aliases_input(trial(inputs=[x], new_out=x.clone())) is None


def test_inputs_mutated_unless_the_reference_mutates_too() -> None:
    x = torch.rand(8)
    saved = [x.clone()]
    x.mul_(0.5)
    t = trial(inputs=[x], saved=saved, ref_mutated=[False])
    assert rg.inputs_mutated(t) == "input 0 was modified in place (the reference leaves it intact)"
    assert rg.inputs_mutated(trial(inputs=[x], saved=saved, ref_mutated=[True])) is None


def test_outputs_cached() -> None:
    old, new = torch.rand(8), torch.rand(8)
    cached = trial(new_out=old.clone(), ref_out=new, previous=(old.clone(), old.clone()))
    assert rg.outputs_cached(cached) == "the output did not change when the inputs did (cached across calls)"
    # the reference did not change either (a constant function): not a cache
    assert rg.outputs_cached(trial(new_out=old, ref_out=old, previous=(old.clone(), old.clone()))) is None
    assert rg.outputs_cached(trial(previous=None)) is None
    # the reference moved only by rounding (PR-67 level 2 problem 41: GroupNorm then a channel mean is 0 up
    # to 1e-8 for any input) while an honest kernel's output stayed exactly 0: not a cache either
    zeros = torch.zeros(8)
    noise = trial(new_out=zeros, ref_out=zeros + 3e-8, previous=(zeros.clone(), zeros - 2e-8))
    assert rg.outputs_cached(noise) is None


def test_first_trial_guard_that_fires_decides() -> None:
    x = torch.rand(8)
    t = trial(threads_after=5, new_out=torch.empty(8, device="meta"), ref_out=x)
    v = first_rejection(t, where=" (trial 1)")
    assert v is not None and v.message.startswith("rejected by guard side_thread:")


def test_kernel_never_called() -> None:
    v = first_rejection(Launch(0.0, ["relu_kernel", "k2"]), log="kernels launched: other")
    assert v is not None and v.log == "kernels launched: other" and v.correct is None
    assert v.message == (
        "rejected by guard kernel_never_called: none of the candidate's kernels (relu_kernel, k2) ran in "
        "forward()"
    )
    assert "(none found)" in rg.kernel_never_called(Launch(0.0, []))
    assert first_rejection(Launch(0.5, ["relu_kernel"])) is None


@pytest.mark.parametrize("actor", ["importing the candidate", "the candidate"])
def test_monkey_patch(actor: str) -> None:
    assert first_rejection(Replaced(actor, [])) is None
    names = [f"torch.f{i}" for i in range(7)]
    v = first_rejection(Replaced(actor, names))
    assert v is not None and v.compiled is True
    assert v.message == f"rejected by guard monkey_patch: {actor} replaced " + ", ".join(names[:5])


def test_tensor_helpers() -> None:
    x = torch.rand(4)
    nested = (x, [x * 2, 3])
    copy = rg.clone(nested)
    assert type(copy) is tuple and type(copy[1]) is list and copy[1][1] == 3
    assert not rg.same_storage(copy[0], x) and rg.same_storage(x[1:], x)
    assert rg.all_equal(copy, nested) and not rg.all_equal(copy, (x, [x, 3]))
    assert len(rg.tensors(nested)) == 2
