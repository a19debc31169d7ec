"""SamplingParams (toolkit/sampler/params.py): every bad value is a ToolkitError naming its field, the
normalisations, the gate flag field by field, generation_config.json loading and the precedence of
generation_config.json < flags < JSONL fields."""
import json
from argparse import Namespace

import numpy as np
import pytest

from toolkit.errors import ToolkitError
from toolkit.cli.requests import Request
from toolkit.sampler.params import GREEDY_BELOW, MAX_LOGPROBS, SamplingParams, load_generation_config

V = 32000
NAN, INF = float("nan"), float("inf")

BAD = [  # (field, value, words the message must hold)
    ("top_p", 0.0, "in (0, 1]"), ("top_p", 1.0000001, "in (0, 1]"), ("top_p", -0.5, "(0, 1]"), ("top_p", NAN, "nan"),
    ("top_k", -2, "[-1,"), ("top_k", 2 ** 31, "[-1,"), ("top_k", 2.0, "integer"), ("top_k", True, "integer"),
    ("temperature", -0.1, ">= 0"), ("temperature", NAN, "finite"), ("temperature", INF, "finite"),
    ("temperature", -INF, "finite"), ("temperature", 10 ** 400, "finite"), ("temperature", True, "finite"),
    ("temperature", "0.7", "finite"), ("temperature", 1e-40, "overflows float32"),
    ("temperature", 5e-324, "overflows float32"),
    ("min_p", -0.01, "[0, 1]"), ("min_p", 1.5, "[0, 1]"), ("min_p", NAN, "[0, 1]"),
    ("repetition_penalty", 0.0, "> 0"), ("repetition_penalty", -1.0, "> 0"), ("repetition_penalty", INF, "> 0"),
    ("repetition_penalty", NAN, "> 0"), ("repetition_penalty", False, "> 0"),
    ("frequency_penalty", 2.5, "[-2, 2]"), ("frequency_penalty", -2.01, "[-2, 2]"), ("frequency_penalty", NAN, "nan"),
    ("presence_penalty", INF, "[-2, 2]"), ("presence_penalty", 3, "[-2, 2]"), ("presence_penalty", True, "[-2, 2]"),
    ("logit_bias", {5: 100.5}, "logit_bias[5]"), ("logit_bias", {5: NAN}, "logit_bias[5]"),
    ("logit_bias", {5: INF}, "logit_bias[5]"), ("logit_bias", {5: True}, "logit_bias[5]"),
    ("logit_bias", {-1: 1.0}, "logit_bias token id"), ("logit_bias", {"5": 1.0}, "logit_bias token id"),
    ("logit_bias", {i: 1.0 for i in range(1025)}, "at most 1024"), ("logit_bias", ((5, 1.0), (5, 2.0)), "twice"),
    ("logit_bias", 5, "logit_bias"), ("logit_bias", ((5,),), "pairs"),
    ("bad_words", [""], "bad_words[0]"), ("bad_words", [()], "bad_words[0]"), ("bad_words", [5], "bad_words[0]"),
    ("bad_words", [(1, -2)], "bad_words[0] token id"), ("bad_words", [(1, True)], "bad_words[0] token id"),
    ("bad_words", ["w"] * 129, "at most 128"), ("bad_words", 5, "bad_words must be a list or one string"),
    ("stop", [""], "stop[0]"), ("stop", [5], "stop[0]"), ("stop", ["s"] * 129, "at most 128"),
    ("stop_token_ids", [-1], "stop_token_ids"), ("stop_token_ids", [1.0], "stop_token_ids"),
    ("stop_token_ids", list(range(129)), "at most 128"), ("stop_token_ids", [True], "stop_token_ids"),
    ("ignore_eos", 1, "ignore_eos"), ("ignore_eos", "yes", "ignore_eos"),
    ("seed", -1, "[0, 2^64)"), ("seed", 2 ** 64, "[0, 2^64)"), ("seed", 1.0, "seed"), ("seed", True, "seed"),
    ("min_tokens", -1, "min_tokens"), ("min_tokens", 257, "min_tokens (257) must be at most max_tokens (256)"),
    ("logprobs", -1, "logprobs"), ("logprobs", MAX_LOGPROBS + 1, "[0, 20]"), ("logprobs", True, "logprobs"),
    ("max_tokens", -1, "max_tokens"), ("max_tokens", 1.5, "max_tokens"), ("max_tokens", np.bool_(True), "max_tokens"),
]


@pytest.mark.parametrize("field,value,words", BAD, ids=[f"{f}={str(v)[:12]}" for f, v, _ in BAD])
def test_bad_values_name_the_field(field, value, words):
    # temperature 1 so greedy normalisation cannot hide a bad top_k / top_p / min_p
    kw = {"temperature": 1.0, field: value}
    with pytest.raises(ToolkitError) as e:
        SamplingParams(**kw)
    msg = str(e.value)
    assert field.split("_")[0] in msg and words in msg and "\n" not in msg


def test_boundaries_are_accepted():
    p = SamplingParams(temperature=2, top_p=1, top_k=-1, min_p=1, repetition_penalty=1e-3, frequency_penalty=-2,
                       presence_penalty=2, logit_bias={i: 100.0 if i % 2 else -100 for i in range(1024)},
                       bad_words=["w"] * 128, stop=["s"] * 128, stop_token_ids=list(range(128)), min_tokens=256,
                       seed=2 ** 64 - 1, logprobs=MAX_LOGPROBS, ignore_eos=np.bool_(True))
    assert (p.temperature, p.top_k, p.top_p, p.frequency_penalty) == (2.0, 0, 1.0, -2.0)
    assert type(p.temperature) is float and type(p.top_p) is float and p.ignore_eos is True
    assert SamplingParams(seed=np.uint64(2 ** 64 - 1)).seed == 2 ** 64 - 1 and SamplingParams(logprobs=0).logprobs == 0


def test_normalisation():
    p = SamplingParams(logit_bias={9: 1, 2: -0.5}, bad_words=["x", [3, 4]], stop="###", stop_token_ids=[7],
                       temperature=0.5)
    assert p.logit_bias == ((2, -0.5), (9, 1.0)) and p.bad_words == ("x", (3, 4))
    assert p.stop == ("###",) and p.stop_token_ids == (7,)
    assert SamplingParams(logit_bias=[(9, 1.0), (2, -0.5)], temperature=0.5).logit_bias == p.logit_bias
    assert hash(p) == hash(SamplingParams(**{f: getattr(p, f) for f in p.__dataclass_fields__}))  # frozen, hashable
    # tiny temperatures are greedy; greedy resets the filters that cannot change an argmax
    assert SamplingParams(temperature=GREEDY_BELOW / 2).temperature == 0.0
    assert SamplingParams(temperature=3e-39).temperature == 0.0  # float32(1/T) is still finite
    g = SamplingParams(temperature=0, top_k=40, top_p=0.5, min_p=0.2, repetition_penalty=1.2)
    assert (g.top_k, g.top_p, g.min_p, g.repetition_penalty) == (0, 1.0, 0.0, 1.2)
    assert SamplingParams(temperature=0.7, top_k=-1).top_k == 0


# -- the gate -----------------------------------------------------------------------------------------------
TRIGGERS = [dict(temperature=0.7), dict(temperature=1 + 1e-7), dict(temperature=1.5), dict(top_k=40, temperature=1),
            dict(top_p=0.9999, temperature=1), dict(min_p=0.05, temperature=1), dict(repetition_penalty=1.1),
            dict(repetition_penalty=0.9), dict(frequency_penalty=0.1), dict(presence_penalty=-0.1),
            dict(logit_bias={1: 0.0}), dict(bad_words=["x"]), dict(bad_words=[(5,)])]


@pytest.mark.parametrize("kw", TRIGGERS, ids=[next(iter(k)) + "=" + str(next(iter(k.values()))) for k in TRIGGERS])
def test_each_field_alone_flips_the_gate(kw):
    assert SamplingParams(**kw).needs_processing(V, has_stop_ids=True)
    assert SamplingParams(**kw).needs_processing(V, has_stop_ids=False)


def test_no_op_requests_keep_the_fast_path():
    for kw in (dict(), dict(temperature=1), dict(temperature=1.0), dict(temperature=0), dict(temperature=1e-6),
               dict(temperature=0, top_k=5, top_p=0.5, min_p=0.5),  # greedy: normalised to off
               dict(temperature=1, top_k=V), dict(temperature=1, top_k=V + 5), dict(temperature=1, top_k=-1),
               dict(stop=["x"], stop_token_ids=[3], ignore_eos=True, seed=3, logprobs=5, max_tokens=9),
               dict(min_tokens=4)):
        assert not SamplingParams(**kw).needs_processing(V, has_stop_ids=False), kw
    assert not SamplingParams(temperature=1, top_k=V).needs_processing(V, has_stop_ids=True)
    assert SamplingParams(temperature=1, top_k=V - 1).needs_processing(V, has_stop_ids=False)


def test_min_tokens_needs_processing_only_with_stop_ids():
    p = SamplingParams(min_tokens=3)
    assert p.needs_processing(V, has_stop_ids=True) and not p.needs_processing(V, has_stop_ids=False)


# -- vocabulary, records ------------------------------------------------------------------------------------
def test_check_vocab():
    SamplingParams(logit_bias={V - 1: 1}, stop_token_ids=[0], bad_words=["any", (V - 1,)]).check_vocab(V)
    for kw, what in ((dict(logit_bias={99999: -5}), "logit_bias: token 99999 is outside the vocabulary [0, 32000)"),
                     (dict(stop_token_ids=[1, V]), f"stop_token_ids: token {V} is outside"),
                     (dict(bad_words=["ok", (1, V + 1)]), f"bad_words[1]: token {V + 1} is outside")):
        with pytest.raises(ToolkitError, match=r"^" + what.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            SamplingParams(**kw).check_vocab(V)


def test_as_record_is_json_and_round_trips():
    p = SamplingParams(temperature=0.8, top_p=0.9, logit_bias={12: -5.0}, bad_words=["no", (3, 4)], stop="\n\n",
                       stop_token_ids=[2], min_tokens=2, logprobs=3)
    rec = p.as_record(seed_used=123)
    assert rec["seed"] == 123 and rec["logit_bias"] == {"12": -5.0} and rec["bad_words"] == ["no", [3, 4]]
    assert list(rec) == list(p.__dataclass_fields__)  # every field, always, in order
    back = json.loads(json.dumps(rec))
    back["logit_bias"] = {int(k): v for k, v in back["logit_bias"].items()}
    assert SamplingParams(**back) == SamplingParams(**{**p.__dict__, "seed": 123})
    assert SamplingParams(seed=5).as_record(None)["seed"] == 5


# -- generation_config.json and precedence --------------------------------------------------------------------
def _model(tmp_path, cfg):
    (tmp_path / "generation_config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return tmp_path


def test_generation_config_fields(tmp_path):
    assert load_generation_config(tmp_path) == {}  # no file
    d = _model(tmp_path, {"do_sample": False, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": None,
                          "repetition_penalty": 1.05, "max_length": 20, "eos_token_id": [1, 2]})
    # vLLM's list; do_sample is ignored (as vLLM does), null means "not set"
    assert load_generation_config(d) == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}


@pytest.mark.parametrize("cfg,words", [({"top_p": 1.5}, "top_p"), ({"temperature": -1}, "temperature"),
                                       ({"top_k": "50"}, "top_k"), ({"repetition_penalty": 0}, "repetition_penalty"),
                                       ({"min_p": True}, "min_p"), ("{bad json", "not valid JSON"),
                                       ("[1]", "expected a JSON object")])
def test_bad_generation_config_names_file_and_field(tmp_path, cfg, words):
    with pytest.raises(ToolkitError) as e:
        load_generation_config(_model(tmp_path, cfg))
    assert "generation_config.json" in str(e.value) and words in str(e.value)


def test_precedence_generation_config_then_flags_then_jsonl(tmp_path):
    from toolkit.cli.generate import setup_arg_parser
    from toolkit.cli.records import sampling_params

    defaults = load_generation_config(_model(tmp_path, {"temperature": 0.6, "top_k": 20, "top_p": 0.9,
                                                         "repetition_penalty": 1.2}))
    args = setup_arg_parser().parse_args(["--top-k", "40", "--top-p", "0.5", "--seed", "9", "x"])
    req = Request(id="0", prompt="x", params={"top_p": 0.7, "max_tokens": 5})
    p = sampling_params(req, args, defaults)
    assert (p.temperature, p.top_k, p.top_p, p.repetition_penalty, p.seed, p.max_tokens) == (0.6, 40, 0.7, 1.2, 9, 5)
    plain = sampling_params(Request(id="1", prompt="x"), setup_arg_parser().parse_args(["x"]), {})
    assert plain == SamplingParams(max_tokens=256)  # nothing given anywhere: greedy, every filter off
    with pytest.raises(ToolkitError, match="min_tokens"):  # the combination is checked per request
        sampling_params(Request(id="2", prompt="x", params={"min_tokens": 10}),
                        setup_arg_parser().parse_args(["--max-tokens", "5", "--prompts-file", "f"]), {})


def test_flags_parse_and_bad_flags_are_argparse_errors(capsys):
    from toolkit.cli.generate import setup_arg_parser
    from toolkit.cli.sampling_flags import check_sampling_args, flag_params

    p = setup_arg_parser()
    args = p.parse_args(["--logit-bias", "13=-5", "--logit-bias", "2=1.5", "--bad-words", "dog", "--stop", "\n\n",
                         "--stop", "END", "--ignore-eos", "--min-tokens", "3", "--logprobs", "2", "--temperature",
                         "0.8", "--top-k", "-1", "--frequency-penalty", "0.5", "x"])
    check_sampling_args(p, args)
    kw = flag_params(args)
    assert kw["logit_bias"] == [(13, -5.0), (2, 1.5)] and kw["stop"] == ["\n\n", "END"] and kw["ignore_eos"] is True
    assert SamplingParams(**kw).logit_bias == ((2, 1.5), (13, -5.0))
    assert flag_params(p.parse_args(["x"])) == {}  # nothing given: generation_config.json shows through
    for argv, words in ((["--top-p", "0"], "top_p must be in (0, 1]"), (["--top-k", "-2"], "top_k"),
                        (["--temperature", "nan"], "temperature"), (["--temperature", "1e-40"], "overflows"),
                        (["--repetition-penalty", "0"], "repetition_penalty"), (["--min-p", "2"], "min_p"),
                        (["--presence-penalty", "inf"], "presence_penalty"), (["--seed", "-1"], "seed"),
                        (["--logprobs", "21"], "logprobs"), (["--logit-bias", "5"], "TOKEN=BIAS"),
                        (["--logit-bias", "5=1000"], "logit_bias[5]"), (["--top-k", "2.5"], "integer"),
                        (["--stop", ""], "non-empty"), (["--max-tokens", "-1"], ">= 0")):
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv + ["x"])
        assert e.value.code == 2 and words in capsys.readouterr().err, argv
    for argv, words in ((["--min-tokens", "300"], "min_tokens (300) must be at most max_tokens (256)"),
                        (["--logit-bias", "5=1", "--logit-bias", "5=2"], "token 5 is given twice")):
        with pytest.raises(SystemExit) as e:
            check_sampling_args(p, p.parse_args(argv + ["x"]))
        assert e.value.code == 2 and words in capsys.readouterr().err, argv
    check_sampling_args(p, p.parse_args(["--min-tokens", "300", "--prompts-file", "f"]))  # JSONL may raise max_tokens


def test_no_fast_path_alias():
    from toolkit.cli.bench import speed_parser
    from toolkit.cli.common import engine_kwargs
    from toolkit.cli.generate import setup_arg_parser

    args = setup_arg_parser().parse_args(["--no-fast-path", "x"])
    assert engine_kwargs(args)["options"].sampler_fast_path is False
    assert engine_kwargs(setup_arg_parser().parse_args(["x"]))["options"].sampler_fast_path is True
    assert speed_parser().parse_args(["--no-fast-path"]).sampler_fast_path == [False]


def test_every_toggle_has_a_no_flag():
    """Every toggle is on by default and gets --no-<toggle>; a removed switch's flag is refused."""
    from toolkit.cli.common import engine_kwargs
    from toolkit.cli.generate import setup_arg_parser
    from toolkit.engine.options import EngineOptions

    p = setup_arg_parser()
    assert engine_kwargs(p.parse_args(["x"]))["options"] == EngineOptions()
    for name in EngineOptions.names():
        off = engine_kwargs(p.parse_args([f"--no-{name.replace('_', '-')}", "x"]))["options"]
        assert off == EngineOptions().with_(**{name: False}), name
    with pytest.raises(SystemExit):
        p.parse_args(["--no-skinny-gemm", "x"])


def test_unused_namespace_fields_are_ignored():
    from toolkit.cli.sampling_flags import flag_params
    assert flag_params(Namespace(temperature=0.5)) == {"temperature": 0.5}
