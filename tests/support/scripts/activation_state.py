"""The overlay's state on import sglang, in the launcher and in a spawned worker, and SGLang's plugin loader."""
import importlib.metadata as md, json, multiprocessing, os, sys
import sglang
import sglang_pcie.runtime.activate as act
import spawn_helper


def main():
    state = {"in_launcher": spawn_helper.overlay_state()}
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # as SGLang starts its scheduler / TP workers
        state["in_spawned_worker"] = pool.apply(spawn_helper.overlay_state)
    state["entry_points"] = [ep.value for ep in md.entry_points(group="sglang.srt.plugins")]
    watcher = next(f for f in sys.meta_path if type(f).__name__ == "ImportWatcher")
    before = {name: len(cbs) for name, cbs in watcher.callbacks.items()}
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    if load_plugins:
        load_plugins()
    state["plugin_framework"] = load_plugins is not None
    # A watched module the plugin loader imports runs (and drops) its callbacks; none may be added or re-armed.
    after = {name: len(cbs) for name, cbs in watcher.callbacks.items()}
    state["callbacks_unchanged_by_plugin_load"] = (
        all(count <= before.get(name, 0) for name, count in after.items())
        and all(name in sys.modules for name in before if after.get(name) != before[name]))
    print(json.dumps(state))


if __name__ == "__main__":  # spawn re-imports this file in the worker as __mp_main__
    main()
