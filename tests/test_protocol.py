"""Settings a strategy would ignore in a suite entry are refused when the suite loads, one line naming the entry
(:meth:`clbench.protocol.StrategyBase.check_entry` and the Configs' own checks): the ignored settings that
tests/test_conformance.py found (Re-Attention without a noise to model, the prior's noise without dp, ``head`` of the
strategies that build their own, the ridge of non-linear members, shards of nlft), EWC settings Avalanche
would refuse only when the run starts, a field set without the setting it is declared used only with, and what a
strategy class declares it needs (the scenario kinds it serves; under dp, no rehearsal memory)."""

from __future__ import annotations

import pytest

from clbench.errors import ConfigError
from clbench.suite_file import parse_suite


def _suite(strategy: dict, scenario: str = "synthetic") -> dict:
    return {"suite": "s", "scenarios": [{"name": scenario}], "strategies": [strategy]}


REFUSED = [
    ({"name": "seqrec", "args": {"attention": "reattention"}}, "movielens_seqrec",
     "attention: reattention corrects the noise of private training: without dp and without sigma_dp"),
    ({"name": "seqrec", "args": {"attention": "reattention", "sigma_dp": 0.5, "prior_noise": 2.0}},
     "movielens_seqrec", "prior_noise is the noise of the private release"),
    ({"name": "icarl", "args": {"head": "incremental"}}, "synthetic",
     "head 'incremental': this strategy always builds its own fixed head"),
    ({"name": "der_dark", "args": {"head": "fixed"}}, "synthetic", "head 'fixed': this strategy always builds"),
    ({"name": "cope", "args": {"head": "multi"}}, "synthetic", "head 'multi': this strategy always builds"),
    ({"name": "nlft", "args": {"ridge": 1e-5}}, "synthetic", "ridge (λ‖Δ‖² on a tangent model's Δ) applies to"),
    ({"name": "model_soup", "args": {"ridge": 1e-5}}, "synthetic", "ridge (λ‖Δ‖² on a tangent model's Δ)"),
    ({"name": "sisa", "args": {"ridge": 1e-5}}, "synthetic", "ridge (λ‖Δ‖² on a tangent model's Δ)"),
    ({"name": "nlft", "args": {"n_shards": 3}}, "synthetic", "n_shards 3: nlft fine-tunes one model"),
    ({"name": "ewc", "args": {"mode": "online"}}, "synthetic", "mode online needs decay_factor"),
    ({"name": "ewc", "args": {"mode": "onlien"}}, "synthetic",
     "args.mode: unknown mode 'onlien'. Did you mean 'online'? Choose one of: separate, online."),
    ({"name": "ewc", "args": {"decay_factor": 0.9}}, "synthetic",
     "args.decay_factor is used only with mode: online (this entry's mode is 'separate')"),
    ({"name": "replay", "preset": "cpu", "args": {"momentum": 0.5}}, "synthetic",
     "args.momentum is used only with optimizer: sgd (this entry's optimizer is 'adam')"),
    ({"name": "seqrec", "args": {}}, "synthetic",
     "it serves next_item scenarios, and scenarios[0] (synthetic) is a classification scenario"),
    ({"name": "most_popular", "args": {}}, "split_digits",
     "it serves next_item scenarios, and scenarios[0] (split_digits) is a classification scenario"),
    ({"name": "naive", "args": {}}, "movielens_seqrec",
     "it serves classification scenarios, and scenarios[0] (movielens_seqrec) is a next_item scenario"),
    ({"name": "lora", "args": {"mem_size": 50}, "dp": {"epsilon": 3.0}}, "synthetic",
     "dp with a rehearsal memory (mem_size 50) is refused: replayed samples are trained on in several "
     "experiences, so the per-experience epsilon would understate theirs; set mem_size: 0."),
]


@pytest.mark.parametrize(("entry", "scenario", "message"), REFUSED,
                         ids=[f"{e['name']}-{'-'.join(e['args'])}-{s}" for e, s, _ in REFUSED])
def test_a_setting_the_strategy_would_ignore_is_refused_at_load(entry, scenario, message):
    with pytest.raises(ConfigError) as info:
        parse_suite(_suite(entry, scenario), "s.yaml")
    assert str(info.value).startswith(f"s.yaml: strategies[0] ({entry['name']}): ") and message in str(info.value)


@pytest.mark.parametrize(("entry", "scenario"), [
    ({"name": "seqrec", "args": {"attention": "reattention"}, "dp": {"epsilon": 8.0}}, "movielens_seqrec"),
    ({"name": "seqrec", "args": {"attention": "reattention", "prior_noise": 2.0}, "dp": {"epsilon": 8.0}},
     "movielens_seqrec"),
    ({"name": "seqrec", "args": {"attention": "reattention", "sigma_dp": 0.5}}, "movielens_seqrec"),
    ({"name": "icarl", "args": {"head": "auto"}}, "synthetic"),
    ({"name": "replay", "args": {"head": "multi"}}, "synthetic"),
    ({"name": "taft", "args": {"ridge": 1e-5}}, "synthetic"),
    ({"name": "model_soup", "args": {"n_shards": 3}}, "synthetic"),
    ({"name": "nlft", "preset": "full"}, "synthetic"),
    ({"name": "sisa", "preset": "full"}, "synthetic"),
    ({"name": "ewc", "args": {"mode": "online", "decay_factor": 0.9}}, "synthetic"),
    ({"name": "replay", "preset": "cpu", "args": {"optimizer": "sgd", "momentum": 0.5}}, "synthetic"),
    ({"name": "most_popular"}, "movielens_seqrec"),
    ({"name": "lora", "args": {"mem_size": 0}, "dp": {"epsilon": 3.0}}, "synthetic"),
])
def test_the_same_settings_load_where_they_act(entry, scenario):
    assert parse_suite(_suite(entry, scenario), "s.yaml").strategies[0].name == entry["name"]
