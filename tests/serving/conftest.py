"""A served embedded model (dice-tiny, on the CPU) for the serving tests: the real checkpoint, so fills end
where a hole's shape ends as they do in the editor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def tiny_engine():
    import engine

    return engine.load_engine(None, device="cpu")


@pytest.fixture(scope="module")
def served(tiny_engine) -> Iterator:
    from dice.serving import ServeConfig, start_in_thread

    with start_in_thread(tiny_engine, ServeConfig(model_name="dice-tiny", max_batch=32)) as running:
        yield running


@pytest.fixture(scope="module")
def keyed(tiny_engine) -> Iterator:
    from dice.serving import ServeConfig, start_in_thread

    with start_in_thread(tiny_engine, ServeConfig(model_name="dice-tiny", api_key="s3cret")) as running:
        yield running
