"""The recorded Builder, IBuilderConfig, IOptimizationProfile and timing cache; build_serialized_network validates and
returns NotAnEngine."""

from __future__ import annotations

from .errors import (
    ArgumentError,
    BuildValidationError,
    NetworkError,
    NotEmulatedError,
)
from .network import RecNetwork
from .objects import Recorded
from .values import NotAnEngine, SimDims


class RecProfile(Recorded):
    def __init__(self, sim):
        super().__init__(sim, "IOptimizationProfile")
        self._shapes: dict[str, tuple] = {}
        self._shape_values: dict[str, tuple] = {}

    def _m_set_shape(self, input, min, opt, max):
        dims = [tuple(int(d) for d in x) for x in (min, opt, max)]
        if len({len(d) for d in dims}) != 1:
            raise NetworkError(f"set_shape('{input}'): min/opt/max ranks differ: {dims}")
        if not all(a <= b <= c for a, b, c in zip(*dims)):
            raise NetworkError(f"set_shape('{input}'): need min <= opt <= max per axis, got {dims}")
        if any(d < 0 for d in dims[0]):
            raise NetworkError(f"set_shape('{input}'): profile dimensions must be non-negative, got {dims}")
        self._shapes[input] = tuple(SimDims(d) for d in dims)

    def _m_get_shape(self, input):
        return list(self._shapes[input]) if input in self._shapes else []

    def _m_set_shape_input(self, input, min, opt, max):
        self._shape_values[input] = (list(min), list(opt), list(max))

    def _m_get_shape_input(self, input):
        return list(self._shape_values.get(input, []))


class RecTimingCache(Recorded):
    def __init__(self, sim, data: bytes):
        super().__init__(sim, "ITimingCache")
        self._data = bytes(data)

    def _m_serialize(self):
        return NotAnEngine(None, None)  # nothing real to serialise; not bytes-like on purpose

    def _m_combine(self, input_cache, ignore_mismatch):
        return True

    def _m_reset(self):
        return True


class RecConfig(Recorded):
    def __init__(self, sim):
        super().__init__(sim, "IBuilderConfig")
        real = sim.real
        self._flags = 0
        self._pools = {}
        self._profiles: list[RecProfile] = []
        self._timing_cache = None
        self._preview = {}
        self._tactic_sources = None
        self._props.update(
            profiling_verbosity=real.ProfilingVerbosity.LAYER_NAMES_ONLY,  # NvInfer.h default
            builder_optimization_level=3,
            progress_monitor=None,
        )

    def _m_set_flag(self, flag):
        self._flags |= 1 << int(flag)

    def _m_clear_flag(self, flag):
        self._flags &= ~(1 << int(flag))

    def _m_get_flag(self, flag):
        return bool(self._flags >> int(flag) & 1)

    def _get_flags(self):
        return self._flags

    def _set_flags(self, value):
        self._flags = int(value)

    def _m_set_memory_pool_limit(self, pool, pool_size):
        if int(pool_size) < 0:
            raise ArgumentError(f"set_memory_pool_limit: pool size must be non-negative, got {pool_size}")
        self._pools[pool.name] = int(pool_size)

    def _m_get_memory_pool_limit(self, pool):
        if pool.name not in self._pools:
            raise NotEmulatedError(f"trtsim does not know the default {pool.name} pool limit (it depends on the GPU)")
        return self._pools[pool.name]

    def _m_add_optimization_profile(self, profile):
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def _get_num_optimization_profiles(self):
        return len(self._profiles)

    def _m_create_timing_cache(self, serialized_timing_cache):
        return RecTimingCache(self._sim, bytes(serialized_timing_cache))

    def _m_set_timing_cache(self, cache, ignore_mismatch):
        self._timing_cache = cache
        return True

    def _m_get_timing_cache(self):
        return self._timing_cache

    def _m_set_preview_feature(self, feature, enable):
        self._preview[feature.name] = bool(enable)

    def _m_get_preview_feature(self, feature):
        if feature.name not in self._preview:
            raise NotEmulatedError(f"trtsim does not know the default of preview feature {feature.name}")
        return self._preview[feature.name]

    def _m_set_tactic_sources(self, tactic_sources):
        self._tactic_sources = int(tactic_sources)
        return True

    def _m_get_tactic_sources(self):
        if self._tactic_sources is None:
            raise NotEmulatedError("trtsim does not know the default tactic sources")
        return self._tactic_sources


class RecBuilder(Recorded):
    def __init__(self, sim, logger):
        super().__init__(sim, "Builder")
        self._logger = logger
        self._networks = []

    def _get_logger(self):
        return self._logger

    def _m_create_network(self, flags=0):
        known = sum(1 << int(m) for m in self._sim.real.NetworkDefinitionCreationFlag.__members__.values())
        if int(flags) & ~known:
            raise ArgumentError(f"create_network: flags {flags:#x} set bits that are not NetworkDefinitionCreationFlag values")
        network = RecNetwork(self._sim, self, flags)
        self._networks.append(network)
        return network

    def _m_create_builder_config(self):
        return RecConfig(self._sim)

    def _m_create_optimization_profile(self):
        return RecProfile(self._sim)

    def _m_build_serialized_network(self, network, config, kernel_text=None):
        from .validate import validate_build

        problems = validate_build(self._sim, network, config)
        if problems:
            for message in problems:
                self._sim.log_to(self._logger, "ERROR", message)
            raise BuildValidationError("the network would not build:\n  " + "\n  ".join(problems))
        monitor = config._props.get("progress_monitor")
        if monitor is not None:
            # Exercise the builder's monitor the way a build would (phase_start, step_complete, phase_finish).
            phase = "trtsim: recording only, nothing is built"
            monitor.phase_start(phase, None, 1)
            keep_going = monitor.step_complete(phase, 0)
            monitor.phase_finish(phase)
            if keep_going is False:
                return None  # a real build is cancelled when step_complete returns False
        return NotAnEngine(network, config)
