import json

import pytest

from dso.config.schema import Config, ConfigError, HParams
from dso.config.sources import build_parser, from_dict, load_file, parse_args


def test_defaults_validate_and_digest_is_stable():
    cfg = Config().validate()
    assert cfg.hparams.digest() == HParams().digest()
    other = HParams(topk=16)
    assert other.digest() != cfg.hparams.digest()


def test_cli_flags_override_file(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('netuid = 7\n[hparams]\ntopk = 16\n[hparams.model]\nd_model = 128\n')
    cfg, _ = parse_args(["--config", str(f), "--hparams.topk", "8", "--wallet.name", "alice"])
    assert (cfg.netuid, cfg.hparams.topk, cfg.hparams.model.d_model, cfg.wallet.name) == (7, 8, 128, "alice")


def test_json_file_and_bool_flags(tmp_path):
    f = tmp_path / "run.json"
    f.write_text(json.dumps({"hparams": {"commit_reveal": True, "dp": {"enabled": True}}}))
    cfg, _ = parse_args(["--config", str(f), "--hparams.dp.enabled", "false"])
    assert cfg.hparams.commit_reveal is True and cfg.hparams.dp.enabled is False


@pytest.mark.parametrize("data, key", [
    ({"hparams": {"topkk": 3}}, "hparams.topkk: unknown key"),
    ({"hparams": {"topk": "many"}}, "hparams.topk: expected an integer"),
    ({"hparams": {"topk": 1.5}}, "hparams.topk: expected an integer"),
    ({"hparams": {"learning_rate": "nan"}}, "hparams.learning_rate: must be finite"),
    ({"hparams": {"aggregation": "vote"}}, "hparams.aggregation: must be one of"),
    ({"hparams": {"topk": 0}}, "hparams.topk: must be > 0"),
    ({"hparams": {"embed_topk": 4097}}, "hparams.embed_topk: 4097 is not in"),
    ({"hparams": {"embed_topk": -1}}, "hparams.embed_topk: -1 is not in"),
    ({"hparams": {"attn_topk": 4097}}, "hparams.attn_topk: 4097 is not in"),
    ({"hparams": {"ffn_topk": -3}}, "hparams.ffn_topk: -3 is not in"),
    ({"hparams": {"model": {"n_heads": 3}}}, "hparams.model.n_heads"),
    ({"wallet": "alice"}, "wallet: expected a table"),
    ({"netuid": True}, "netuid: expected an integer"),
    ({"neuron": {"step_sequences": -1}}, "neuron.step_sequences: must be >= 0"),
])
def test_bad_values_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict(data)


def test_cli_rejects_bad_file_with_message(tmp_path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text("[hparams]\nnot_a_key = 1\n")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--config", str(f)])
    assert exc.value.code == 2
    assert "hparams.not_a_key: unknown key" in capsys.readouterr().err


def test_unparsable_file(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid json"):
        load_file(f)


def test_print_config_prints_everything(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--print-config", "--hparams.topk", "12"])
    assert exc.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["hparams"]["topk"] == 12 and printed["wallet"]["name"] == "default"
    assert set(printed) == set(Config().to_dict())


def test_every_leaf_has_a_flag_and_a_doc():
    parser = build_parser()
    flags = {a.option_strings[0] for a in parser._actions if a.option_strings}
    for key in ("--netuid", "--wallet.name", "--storage.endpoint", "--hparams.topk", "--hparams.dp.delta"):
        assert key in flags
    assert all(a.help for a in parser._actions)


# ------------------------------------------------------------------ model presets
def test_preset_sets_the_shape_and_explicit_keys_override_it(tmp_path):
    from dso.nn.presets import PRESETS
    cfg, _ = parse_args(["--hparams.model.preset", "125m", "--hparams.model.n_layers", "6"])
    m = cfg.hparams.model
    assert (m.d_model, m.n_heads, m.ffn_hidden, m.n_layers) == (768, 12, 2048, 6)
    # in a file the preset applies first too, wherever it stands among the keys
    f = tmp_path / "run.json"
    f.write_text(json.dumps({"hparams": {"model": {"n_layers": 3, "preset": "25m"}}}))
    m = parse_args(["--config", str(f)])[0].hparams.model
    assert (m.d_model, m.n_layers) == (PRESETS["25m"]["d_model"], 3)
    assert from_dict({"hparams": {"model": {"preset": "1b"}}}).hparams.model.d_model == 2048
    with pytest.raises(ConfigError, match="hparams.model.preset: must be one of tiny, 25m, 125m, 1b"):
        from_dict({"hparams": {"model": {"preset": "7b"}}})


def test_preset_parameter_counts_match_the_built_model():
    import torch

    from dso.config.schema import ModelConfig
    from dso.nn.model import Decoder, parameter_count
    from dso.nn.presets import PRESETS, non_embedding_parameters, total_parameters
    for shape in PRESETS.values():
        cfg = ModelConfig(**shape, vocab_size=1024)
        with torch.device("meta"):  # shapes only: the 1 B preset needs no memory here
            built = parameter_count(Decoder(cfg))
        assert built == total_parameters(**shape, vocab_size=1024)
        assert built - 1024 * shape["d_model"] == non_embedding_parameters(**shape)
    millions = {name: non_embedding_parameters(**shape) / 1e6 for name, shape in PRESETS.items()}
    assert 3 < millions["tiny"] < 3.5 and 20 < millions["25m"] < 30 and 110 < millions["125m"] < 140
    assert 0.9e3 < millions["1b"] < 1.2e3
    assert ModelConfig(**PRESETS["tiny"]) == ModelConfig()  # the tiny preset is the default shape


def test_help_documents_the_presets_and_the_tokeniser(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--hparams.model.preset" in out and "125m = d_model 768, 18 layers" in out
    assert "--hparams.tokenizer" in out and "--data.tokenizer_file" in out


@pytest.mark.parametrize("data, key", [
    ({"hparams": {"inner": {"steps_max": 0}}}, "hparams.inner.steps_max: must be > 0"),
    ({"hparams": {"inner": {"beta2": 1.0}}}, "hparams.inner.beta2: must be in"),
    ({"hparams": {"inner": {"mode": "dream"}}}, "hparams.inner.mode: must be one of"),
    ({"hparams": {"inner": {"min_lr_ratio": 1.5}}}, "hparams.inner.min_lr_ratio"),
    ({"hparams": {"inner": {"clip_norm": -1.0}}}, "hparams.inner"),
    ({"hparams": {"outer": {"rule": "adam"}}}, "hparams.outer.rule: must be one of"),
    ({"hparams": {"outer": {"momentum": 1.0}}}, "hparams.outer.momentum: must be in"),
    ({"hparams": {"outer": {"lr": 0.0}}}, "hparams.outer.lr: must be > 0"),
    ({"hparams": {"dct": "maybe"}}, "hparams.dct: expected true/false"),
    ({"hparams": {"help_rule": "mean"}}, "hparams.help_rule: must be one of"),
])
def test_bad_inner_outer_and_codec_values_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict(data)


def test_inner_outer_flags_and_paper_mode():
    cfg, _ = parse_args(["--hparams.inner.lr", "1e-3", "--hparams.outer.rule", "nesterov", "--hparams.dct", "true",
                         "--hparams.inner.mode", "gradient"])
    hp = cfg.hparams
    assert (hp.inner.lr, hp.outer.rule, hp.dct, hp.inner.mode) == (1e-3, "nesterov", True, "gradient")
    assert hp.digest() != HParams().digest()
    # the gauntlet profile: the paper's gradient, DCT codec and signed step, and its PeerScore with c = 2
    from dso.config.sources import use_profile

    paper = use_profile(HParams(), "gauntlet")
    assert (paper.inner.mode, paper.outer.rule, paper.dct, paper.outer.lr, paper.weight_power, paper.pay_rule,
            paper.help_rule, paper.help_share) == ("gradient", "signed", True, 2.0, 2.0, "peerscore", "best_of_two",
                                                   0.2)
    default = HParams()
    assert (default.dct, default.outer.lr, default.weight_power, default.help_rule, default.help_share) == \
        (False, 2.5, 1.0, "mean_of_record", 0.3)


def test_set_hparams_applies_command_line_items_in_order_and_names_a_bad_one():
    from dso.config.sources import set_hparams

    cfg = Config()
    set_hparams(cfg, ["hparams.topk=16", "hparams.inner.lr=0.001", "hparams.topk=8"])
    assert cfg.hparams.topk == 8 and cfg.hparams.inner.lr == 0.001
    for bad in ("topk=3", "hparams.topk"):
        with pytest.raises(ConfigError, match="expected hparams.KEY=VALUE"):
            set_hparams(cfg, [bad])


def test_a_profile_is_the_base_that_a_config_file_and_flags_override(tmp_path):
    from dso.config.sources import profile_names

    assert {"default", "dct", "gauntlet"} <= set(profile_names())
    assert parse_args([])[0].hparams.digest() == HParams().digest()  # the default profile is the defaults
    cfg, _ = parse_args(["--profile", "gauntlet"])
    assert (cfg.hparams.outer.rule, cfg.hparams.inner.mode, cfg.hparams.weight_power) == ("signed", "gradient", 2.0)
    file = tmp_path / "c.toml"
    file.write_text("[hparams]\nweight_power = 1.5\n")
    cfg, _ = parse_args(["--profile", "gauntlet", "--config", str(file), "--hparams.outer.lr", "3.0"])
    assert (cfg.hparams.weight_power, cfg.hparams.outer.lr, cfg.hparams.outer.rule) == (1.5, 3.0, "signed")


@pytest.mark.parametrize("name", ["nosuch", "../default", "Default", ""])
def test_an_unknown_or_malformed_profile_name_is_refused_with_the_known_ones(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--profile", name])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no such profile" in err and "gauntlet" in err


def test_a_profile_holds_only_protocol_keys(tmp_path, monkeypatch):
    from dso.config import sources as config_sources

    (tmp_path / "odd.toml").write_text("[hparams]\ntopk = 8\n[storage]\nbucket = 'x'\n")
    monkeypatch.setattr(config_sources, "PROFILES", tmp_path)
    with pytest.raises(ConfigError, match=r"only \[hparams\] belongs in a profile"):
        config_sources.profile_data("odd")
