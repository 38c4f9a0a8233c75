"""A data-parallel model's routing (the live core with the fewest items in flight), the devices
each core gets, the settings that ask for cores, and a dead core's shutdown racing vLLM's own
monitor. The cores' engines here are stand-ins with the attributes routing and that shutdown
read; tests/server/test_data_parallel.py runs real engine cores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import multiprocessing
import threading

import grpc
import psutil
import pytest
from prometheus_client import REGISTRY

from scoring_server.config import ModelSettings
from scoring_server.cores import EngineClientSlot, EngineCore, core_devices, device_environment, route, stop_together
from scoring_server.errors import ServiceError


@dataclass
class _Engine:
    errored: bool = False


def _cores(count: int, model: str = "dp") -> list[EngineCore]:
    return [EngineCore(model, i, engine=cast(Any, _Engine())) for i in range(count)]


def _gauge(model: str, core: int) -> float | None:
    return REGISTRY.get_sample_value("scoring_engine_core_items_in_flight", {"model": model, "core": str(core)})


def test_calls_go_to_the_core_with_the_fewest_items_in_flight() -> None:
    cores = _cores(3, "fewest")
    with route(cores, 20) as first, route(cores, 5) as second, route(cores, 1) as third:
        assert (first.index, second.index, third.index) == (0, 1, 2)
        # core 2 holds 1 item, core 1 holds 5, core 0 holds 20
        with route(cores, 4) as fourth:
            assert fourth.index == 2 and fourth.items_in_flight == 5
            assert [c.items_in_flight for c in cores] == [20, 5, 5]
            assert _gauge("fewest", 0) == 20 and _gauge("fewest", 2) == 5
    assert [c.items_in_flight for c in cores] == [0, 0, 0]
    assert [c.calls_in_flight for c in cores] == [0, 0, 0]
    assert _gauge("fewest", 0) == 0


def test_idle_cores_take_turns_by_items_sent_so_far() -> None:
    """One call at a time still visits every core: ties go to the core sent the fewest items."""
    cores = _cores(2, "turns")
    visited = []
    for items in (10, 3, 3, 3, 3, 10):
        with route(cores, items) as core:
            visited.append(core.index)
    assert visited == [0, 1, 1, 1, 1, 0]
    assert [c.items_routed for c in cores] == [20, 12]
    assert REGISTRY.get_sample_value("scoring_engine_core_calls_total", {"model": "turns", "core": "1"}) == 4


def test_a_dead_core_gets_no_calls_and_none_left_is_unavailable() -> None:
    cores = _cores(2, "dead")
    cast(Any, cores[0].engine).errored = True
    for _ in range(3):
        with route(cores, 1) as core:
            assert core.index == 1
    cast(Any, cores[1].engine).errored = True
    with pytest.raises(ServiceError) as refused:
        route(cores, 1)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE and "dead" in str(refused.value)


def test_a_failed_call_releases_its_items() -> None:
    cores = _cores(1, "failed")
    with pytest.raises(RuntimeError), route(cores, 7):
        raise RuntimeError("engine request failed")
    assert cores[0].items_in_flight == 0 and cores[0].calls_in_flight == 0


def test_each_core_takes_its_own_group_of_devices() -> None:
    assert core_devices(2, 1, None, 2) == ["0", "1"]
    assert core_devices(2, 2, None, 8) == ["0,1", "2,3"]
    # the process's own CUDA_VISIBLE_DEVICES is the pool, in its order
    assert core_devices(2, 1, "3, 5,6", None) == ["3", "5"]
    assert device_environment("3") == {"CUDA_VISIBLE_DEVICES": "3"}
    assert device_environment("") == {}


@pytest.mark.parametrize(
    ("cores", "per_core", "visible", "available", "says"),
    [(2, 1, None, 1, "1 visible GPUs"), (2, 2, "0,1,2", None, "CUDA_VISIBLE_DEVICES='0,1,2'")],
)
def test_too_few_devices_refuse_to_start(cores: int, per_core: int, visible: str | None, available: int, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        core_devices(cores, per_core, visible, available)
    assert f"needs {cores * per_core} GPUs" in str(refused.value) and says in str(refused.value)


def test_data_parallel_size_is_a_model_setting() -> None:
    model = ModelSettings(name="m", path="/m", dtype="bfloat16", data_parallel_size=4)
    assert model.data_parallel_size == 4
    assert ModelSettings(name="m", path="/m", dtype="bfloat16").data_parallel_size == 1
    with pytest.raises(ValueError, match="data_parallel_size"):
        ModelSettings(name="m", path="/m", dtype="bfloat16", data_parallel_size=0)


@pytest.mark.parametrize("key", ["data_parallel_size", "data_parallel_rank"])
def test_vllm_data_parallelism_in_engine_args_is_refused_with_the_setting_to_use(key: str) -> None:
    with pytest.raises(ValueError) as refused:
        ModelSettings(name="m", path="/m", dtype="bfloat16", engine_args={key: 2})
    assert f"engine_args.{key}" in str(refused.value) and "the model's data_parallel_size" in str(refused.value)


@dataclass
class _Resources:
    engine_dead: bool = False
    closed: int = 0

    def __call__(self) -> None:
        self.closed += 1


@dataclass
class _RacedClient:
    """A client whose shutdown meets the race with vLLM's own monitor: the core reaped between
    the manager's liveness check and its kill of the core's process tree."""

    resources: _Resources

    def shutdown(self, timeout: float | None = None) -> None:
        raise psutil.NoSuchProcess(12345)


@dataclass
class _DeadEngine:
    engine_core: _RacedClient


def test_a_core_reaped_during_its_shutdown_still_has_its_sockets_closed() -> None:
    """notice_death survives the race (the engine watch that calls it must not end there) and
    still closes the client's sockets, so the calls in flight on the dead core fail."""
    dead = multiprocessing.get_context("spawn").Event()
    dead.set()
    engine = _DeadEngine(_RacedClient(_Resources()))
    core = EngineCore("raced", 0, slot=EngineClientSlot({}, 1, 0, dead), engine=cast(Any, engine))
    core.notice_death()
    assert engine.engine_core.resources.engine_dead
    assert engine.engine_core.resources.closed == 1
    core.notice_death()  # once marked dead, nothing more
    assert engine.engine_core.resources.closed == 1


def test_cores_stop_together_and_every_stop_runs_before_an_error_is_raised() -> None:
    """Each stop waits for its core's processes; they wait at the same time, not one after
    another (a barrier only the stops running together can pass), and one that fails neither
    skips the others nor goes unreported."""
    together = threading.Barrier(3, timeout=10)
    stopped: list[int] = []

    def stop(index: int) -> None:
        together.wait()
        stopped.append(index)
        if index == 1:
            raise RuntimeError("core 1 would not stop")

    with pytest.raises(RuntimeError, match="core 1"):
        stop_together([lambda i=i: stop(i) for i in range(3)])
    assert sorted(stopped) == [0, 1, 2]
