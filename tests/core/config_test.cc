#include <gtest/gtest.h>

#include <algorithm>

#include <fstream>
#include <numeric>

#include "loom/core/config.h"
#include "loom/core/error.h"

namespace loom {
namespace {

std::string error_of(const std::vector<std::string>& sets, const std::string& toml = "") {
  try {
    if (toml.empty()) load_config("", sets);
    else config_from_toml_string(toml, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultIsTinyAndValid) {
  Config c = load_config("", {});
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_TRUE(validation_errors(c).empty());
}

TEST(Config, PresetSetsEveryModelKeyAndExplicitKeysOverride) {
  Config c = load_config("", {"model.preset=gpt2", "model.layers=2"});
  EXPECT_EQ(c.model.d_model, 768);
  EXPECT_EQ(c.model.vocab, 50257);
  EXPECT_EQ(c.model.layers, 2);
  Config l = load_config("", {"model.preset=llama"});
  EXPECT_EQ(l.model.arch, Arch::kLlama);
  EXPECT_EQ(l.model.kv_heads, 2);
  // Order does not matter: the preset applies first.
  Config o = load_config("", {"model.layers=3", "model.preset=gpt2-medium"});
  EXPECT_EQ(o.model.layers, 3);
  EXPECT_EQ(o.model.d_model, 1024);
}

TEST(Config, GptKvHeadsFollowHeads) {
  Config c = load_config("", {"model.heads=8"});
  EXPECT_EQ(c.model.kv_heads, 8);
}

TEST(Config, UnknownKeysAndSectionsAreNamed) {
  EXPECT_NE(error_of({"model.layyers=3"}).find("unknown config key 'model.layyers'"), std::string::npos);
  EXPECT_NE(error_of({"model.layyers=3"}).find("layers"), std::string::npos);  // lists known keys
  EXPECT_NE(error_of({"modle.layers=3"}).find("unknown config section 'modle'"), std::string::npos);
  EXPECT_NE(error_of({"train.steps"}).find("expected section.key=value"), std::string::npos);
  EXPECT_NE(error_of({}, "[model]\nbogus = 1\n").find("model.bogus"), std::string::npos);
}

TEST(Config, TypeErrorsNameTheValueAndTheExpectedForm) {
  EXPECT_NE(error_of({"train.steps=ten"}).find("'train.steps' = 'ten': expected an integer"), std::string::npos);
  EXPECT_NE(error_of({"optim.lr=fast"}).find("expected a finite number"), std::string::npos);
  EXPECT_NE(error_of({}, "[train]\nsteps = \"10\"\n").find("expected an integer"), std::string::npos);
  // A float where an integer belongs, far outside int64 (found by the config fuzzer: it was
  // converted before its type was checked, which UBSan reports).
  EXPECT_NE(error_of({}, "[model]\nlayers = 6.6e42\n").find("expected an integer"), std::string::npos);
  EXPECT_NE(error_of({}, "[train]\nsteps = 3.0\n").find("expected an integer"), std::string::npos);
  // A model far out of range is reported alone, before checks that build per-layer lists.
  EXPECT_NE(error_of({"model.layers=6305930593059305959"}).find("model.layers = 6305930593059305959: expected at most"),
            std::string::npos);
  EXPECT_NE(error_of({"model.preset=huge"}).find("expected one of tiny"), std::string::npos);
}

TEST(Config, ValidationListsEveryViolation) {
  std::string e = error_of({"model.heads=5", "train.batch=0", "optim.lr=-1"});
  EXPECT_NE(e.find("model.heads = 5 does not divide model.d_model = 128"), std::string::npos) << e;
  EXPECT_NE(e.find("train.batch = 0: expected a positive integer"), std::string::npos) << e;
  EXPECT_NE(e.find("optim.lr = -1"), std::string::npos) << e;
  EXPECT_NE(error_of({"model.layers=-2"}).find("model.layers = -2"), std::string::npos);
  EXPECT_NE(error_of({"train.grad_accum=3"}).find("does not divide train.batch = 16"), std::string::npos);
  EXPECT_NE(error_of({"model.vocab=100"}).find("vocab >= 256"), std::string::npos);
  EXPECT_NE(error_of({"model.preset=llama", "model.kv_heads=3"}).find("kv_heads = 3 does not divide"), std::string::npos);
  EXPECT_NE(error_of({"train.seq=1000"}).find("exceeds model.ctx = 128"), std::string::npos);
  // fp8 GEMMs (Note [CUDA fp8 linear layers]) run on the GPU only; a format unknown is named.
  EXPECT_NE(error_of({"train.gemm_format=fp8"}).find("train.gemm_format = fp8 with train.device = cpu"),
            std::string::npos);
  EXPECT_NE(error_of({"train.gemm_format=fp4"}).find("train.gemm_format = 'fp4': expected bf16, fp8"),
            std::string::npos);
  EXPECT_NE(error_of({"train.gemm_format=mxfp8"}).find("engine runs bf16 or fp8"), std::string::npos);
  EXPECT_EQ(error_of({"train.gemm_format=fp8", "train.device=cuda"}), "");
}

// load_config_unvalidated types and parses what it is given but leaves the values'
// validation to a later load_config (loom simulate derives its layout in between).
TEST(Config, UnvalidatedLoadParsesButDoesNotValidate) {
  EXPECT_NE(error_of({"model.heads=5"}), "");
  EXPECT_EQ(load_config_unvalidated("", {"model.heads=5", "train.batch=8"}).model.heads, 5);
  EXPECT_THROW(load_config_unvalidated("", {"model.heads=five"}), ConfigError);
  EXPECT_THROW(load_config_unvalidated("", {"model.hedas=4"}), ConfigError);
}

TEST(Config, ParallelLayoutKeepsTheGlobalBatch) {
  Config c = load_config("", {"parallel.dp=2", "train.grad_accum=2"});  // batch 16
  EXPECT_EQ(c.micro_batch(), 4);
  EXPECT_EQ(c.micro_batch() * c.train.grad_accum * c.parallel.dp, c.train.batch);
  Config m = load_config("", {"parallel.dp=4", "parallel.micro_batch=2", "train.grad_accum=2"});
  EXPECT_EQ(m.micro_batch(), 2);
  EXPECT_EQ(m.parallel.world(), 4);
  // micro x accum x dp must be the global batch: the error offers the fix.
  const std::string e = error_of({"parallel.dp=2", "parallel.micro_batch=2"});
  EXPECT_NE(e.find("2 x 1 x 2 = 4 but train.batch (the global batch) = 16"), std::string::npos) << e;
  EXPECT_NE(e.find("set train.grad_accum = 4"), std::string::npos) << e;
  const std::string d = error_of({"parallel.dp=3"});
  EXPECT_NE(d.find("x 3 does not divide train.batch = 16"), std::string::npos) << d;
  EXPECT_EQ(error_of({"parallel.dp=3", "train.batch=12"}), "");
  EXPECT_EQ(error_of({"parallel.dp=3", "train.batch=12", "train.grad_accum=2"}), "");
}

TEST(Config, ParallelViolationsAreAllListedWithValidChoices) {
  // heads 6: tp 4 is invalid; the valid tp values are the common divisors of heads and ffn.
  const std::string tp = error_of({"model.heads=6", "model.d_model=96", "model.ffn=384", "parallel.tp=4"});
  EXPECT_NE(tp.find("parallel.tp = 4 does not divide model.heads = 6"), std::string::npos) << tp;
  EXPECT_NE(tp.find("valid tp: 1, 2, 3, 6"), std::string::npos) << tp;
  const std::string many = error_of({"parallel.pp=5", "parallel.zero=4", "parallel.sp=true", "parallel.schedule=zb",
                                     "parallel.recompute=some"});
  EXPECT_NE(many.find("5 problems"), std::string::npos) << many;
  EXPECT_NE(many.find("exceeds model.layers = 4"), std::string::npos) << many;
  EXPECT_NE(many.find("valid pp at vpp 1: 1..4"), std::string::npos) << many;
  EXPECT_NE(many.find("parallel.zero = 4: expected 0, 1, 2 or 3"), std::string::npos) << many;
  EXPECT_NE(many.find("parallel.sp = true needs parallel.tp > 1"), std::string::npos) << many;
  EXPECT_NE(many.find("parallel.schedule = 'zb'"), std::string::npos) << many;
  EXPECT_NE(many.find("parallel.recompute = 'some'"), std::string::npos) << many;
  // Per-layer recompute: policy[*count] entries covering exactly model.layers (4 here).
  EXPECT_EQ(error_of({"parallel.recompute=full*3,none"}), "");
  EXPECT_EQ(error_of({"parallel.recompute=selective,none,full,none"}), "");
  EXPECT_NE(error_of({"parallel.recompute=full*3"}).find("covers 3 of model.layers = 4"), std::string::npos);
  EXPECT_NE(error_of({"parallel.recompute=full*9"}).find("more than model.layers = 4"), std::string::npos);
  EXPECT_NE(error_of({"parallel.recompute=full*x,none"}).find("no positive count"), std::string::npos);
  {
    ParallelConfig p;
    p.recompute = parse_recompute("full*2,selective,none");
    EXPECT_EQ(p.recompute_layers(4),
              (std::vector<Recompute>{Recompute::kFull, Recompute::kFull, Recompute::kSelective, Recompute::kNone}));
    p.recompute = parse_recompute("selective");
    EXPECT_EQ(p.recompute_layers(3), std::vector<Recompute>(3, Recompute::kSelective));
  }
  EXPECT_NE(error_of({"parallel.pp=2", "parallel.vpp=2"}).find("needs parallel.schedule = interleaved"),
            std::string::npos);
  EXPECT_NE(error_of({"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=1"})
                .find("divisible by parallel.pp = 2"),
            std::string::npos);
  EXPECT_EQ(error_of({"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=2"}), "");
  EXPECT_NE(error_of({"parallel.pp=2", "parallel.pp_layers=3,3"}).find("summing to model.layers = 4"),
            std::string::npos);
  EXPECT_NE(error_of({"parallel.pp=2", "parallel.pp_layers=3,x"}).find("'x' is not a layer count"),
            std::string::npos);
  EXPECT_NE(error_of({"parallel.pp=2", "parallel.pp_layers=5,-1"}).find("'-1' is not a layer count"),
            std::string::npos);
  EXPECT_EQ(error_of({"parallel.pp=2", "parallel.pp_layers=1,3"}), "");
  // Note [Stage split]: the ends may hold no block; a middle stage may not.
  EXPECT_EQ(error_of({"parallel.pp=2", "parallel.pp_layers=0,4"}), "");
  EXPECT_EQ(error_of({"parallel.pp=3", "parallel.pp_layers=0,4,0", "train.grad_accum=4"}), "");
  EXPECT_NE(error_of({"parallel.pp=3", "parallel.pp_layers=2,0,2", "train.grad_accum=4"})
                .find("stage 1 holds no layers; only the first stage (it embeds) and the last"),
            std::string::npos);
  EXPECT_NE(error_of({"parallel.pp=2", "parallel.pp_layers=1,3", "parallel.pp_account_loss=true"})
                .find("fixes every stage's layers"),
            std::string::npos);
  // Accounting lets 4 layers + embedding + loss fill 6 stages (pp 3 x vpp 2); without it, 5
  // stages is the most.
  EXPECT_EQ(error_of({"parallel.pp=3", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=3",
                      "train.batch=12", "parallel.pp_account_embedding=true", "parallel.pp_account_loss=true"}),
            "");
  EXPECT_NE(error_of({"parallel.pp=3", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=3",
                      "train.batch=12"})
                .find("6 stages exceeds model.layers = 4"),
            std::string::npos);
  EXPECT_NE(error_of({}, "[parallel]\ndp = 2\nbogus = 1\n").find("keys in [parallel]"), std::string::npos);
}

// Issue 23 item 6: a TOML file's inf and nan are refused as --set's are (one rule for
// every source), for every float key; train sizes are bounded before any product.
TEST(Config, NonFiniteNumbersAndHugeSizesAreRefusedFromEverySource) {
  for (const char* key : {"optim.lr", "optim.weight_decay", "model.init_std", "model.norm_eps", "optim.grad_clip",
                          "model.rope_theta", "comm.timeout_s", "comm.hang_s"}) {
    const std::string k = key, sec = k.substr(0, k.find('.')), name = k.substr(k.find('.') + 1);
    for (const char* bad : {"inf", "-inf", "nan"}) {
      const std::string toml = "[" + sec + "]\n" + name + " = " + bad + "\n";
      EXPECT_NE(error_of({}, toml).find("'" + k + "' = '"), std::string::npos) << toml;
      EXPECT_NE(error_of({}, toml).find("expected a finite number"), std::string::npos) << toml;
      EXPECT_NE(error_of({k + "=" + bad}).find("expected a finite number"), std::string::npos) << k << "=" << bad;
    }
  }
  EXPECT_NE(error_of({"train.batch=9223372036854775807"}).find("train.batch = 9223372036854775807: expected at most"),
            std::string::npos);
  EXPECT_NE(error_of({"train.batch=4611686018427387904"}).find("expected at most 16777216"), std::string::npos);
  EXPECT_NE(error_of({"comm.timeout_s=1e308"}).find("expected seconds in (0, 1e9)"), std::string::npos);
  // Note [Heartbeats]: beats come once a second, so a hang check shorter than 2 s would
  // fire between two of them.
  for (const char* bad : {"comm.hang_s=-1", "comm.hang_s=1", "comm.hang_s=1e12"})
    EXPECT_NE(error_of({bad}).find("expected 0 (no hang check) or seconds in [2, 1e9)"), std::string::npos) << bad;
}

// Note [Stage split]: the even split, Megatron-LM's accounted split, and pp_layers as given.
TEST(Config, StageSplitCountsTheEmbeddingAndTheLossWhereAsked) {
  ParallelConfig p;
  p.pp = 8, p.vpp = 8;
  std::vector<int> even = p.layer_split(126);  // 126 over 64: 62 stages of 2, the ends 1
  EXPECT_EQ(even.front(), 1);
  EXPECT_EQ(even.back(), 1);
  EXPECT_EQ(std::count(even.begin(), even.end(), 2), 62);
  p.pp_account_embedding = p.pp_account_loss = true;  // 128 over 64, the ends give one back
  const std::vector<int> both = p.layer_split(126);
  EXPECT_EQ(both.front(), 1);
  EXPECT_EQ(both.back(), 1);
  EXPECT_EQ(std::count(both.begin(), both.end(), 2), 62);
  p.pp = 16;  // 128 over 128: the first stage only embeds, the last only runs the head
  const std::vector<int> ends = p.layer_split(126);
  EXPECT_EQ(ends.front(), 0);
  EXPECT_EQ(ends.back(), 0);
  EXPECT_EQ(std::count(ends.begin(), ends.end(), 1), 126);
  ParallelConfig q;
  q.pp = 2;
  EXPECT_EQ(q.layer_split(6), (std::vector<int>{3, 3}));
  q.pp_account_loss = true;  // 7 over 2 = 4, 3, and the last gives one to the loss
  EXPECT_EQ(q.layer_split(6), (std::vector<int>{4, 2}));
  q.pp_account_loss = false, q.pp_account_embedding = true;
  EXPECT_EQ(q.layer_split(6), (std::vector<int>{3, 3}));
  q.pp_layers = {1, 5};
  q.pp_account_embedding = false;
  EXPECT_EQ(q.layer_split(6), (std::vector<int>{1, 5}));
}

// Note [Stage split]: with the vocabulary over the pipeline, no rank takes a second block of
// the remainder before every rank has one.
TEST(Config, StageSplitWithTheVocabularySplitBalancesTheRanks) {
  ParallelConfig p;
  p.pp = 2, p.vpp = 2, p.schedule = ScheduleKind::kZbV;
  EXPECT_EQ(p.layer_split(6), (std::vector<int>{1, 2, 2, 1}));  // rank 0 (the V's ends) embeds and runs the head
  p.pp_vocab = true;
  EXPECT_EQ(p.layer_split(6), (std::vector<int>{2, 2, 1, 1}));  // 3 blocks a rank, not 2 and 4
  EXPECT_EQ(rank_balanced_stage_split(6, 2, 2, p.schedule, true), (std::vector<int>{1, 1, 2, 2}));  // the other tie
  EXPECT_EQ(p.layer_split(7), (std::vector<int>{2, 2, 2, 1}));  // the third: rank 1's middle stage
  EXPECT_EQ(p.layer_split(8), (std::vector<int>{2, 2, 2, 2}));
  p.pp = 4;  // stages 3 and 4 are rank 3's, 2 and 5 rank 2's
  EXPECT_EQ(p.layer_split(10), (std::vector<int>{1, 1, 2, 2, 1, 1, 1, 1}));
  for (int layers : {8, 9, 11, 13, 15}) {
    const std::vector<int> split = p.layer_split(layers);
    std::vector<int> per_rank(4, 0);
    for (int v = 0; v < 8; ++v) per_rank[size_t(stage_rank(p.schedule, 4, v))] += split[size_t(v)];
    EXPECT_LE(*std::max_element(per_rank.begin(), per_rank.end()) - *std::min_element(per_rank.begin(), per_rank.end()),
              1)
        << layers << " layers";
    EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), layers);
  }
  // Interleaved: the middle stages are already different ranks' (v mod pp), so as before.
  p.schedule = ScheduleKind::kInterleaved1F1B, p.pp = 2;
  EXPECT_EQ(p.layer_split(6), even_stage_split(6, 4));
  p.pp_vocab = false;
  EXPECT_EQ(p.layer_split(6), (std::vector<int>{1, 2, 2, 1}));
}

TEST(Config, TomlRoundTrip) {
  Config c = load_config("", {"model.preset=llama", "optim.lr=0.0003", "data.path=/x y", "train.steps=7",
                              "parallel.dp=2", "parallel.pp_layers=4,4", "parallel.pp=2"});
  Config d = config_from_toml_string(to_toml(c));
  EXPECT_EQ(to_toml(c), to_toml(d));
  EXPECT_EQ(d.optim.lr, 0.0003);
  EXPECT_EQ(d.data.path, "/x y");
  EXPECT_EQ(d.train.steps, 7);
  EXPECT_EQ(pp_layers_text(d.parallel.pp_layers), "4,4");
  EXPECT_EQ(d.parallel.pp_layers, (std::vector<int64_t>{4, 4}));
}

// Issue 13 item 2: the layout keys are values in ParallelConfig; only the schema converts
// their text, and it prints them back as written (run-length per layer).
TEST(Config, LayoutKeysAreTypedValuesThatPrintBackAsWritten) {
  const Config c = load_config("", {"parallel.recompute=full*2,selective,none", "parallel.dp=2", "parallel.zero=3",
                                    "parallel.zero_keep=keep,shard*3", "parallel.schedule=gpipe"});
  EXPECT_EQ(c.parallel.recompute,
            (std::vector<Recompute>{Recompute::kFull, Recompute::kFull, Recompute::kSelective, Recompute::kNone}));
  EXPECT_EQ(c.parallel.zero_keep, (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::kGPipe);
  const std::string toml = to_toml(c);
  EXPECT_NE(toml.find("recompute = 'full*2,selective,none'"), std::string::npos) << toml;
  EXPECT_NE(toml.find("zero_keep = 'keep,shard*3'"), std::string::npos) << toml;
  EXPECT_NE(toml.find("schedule = 'gpipe'"), std::string::npos) << toml;
  // Coverage is checked against the final layer count, whatever order the keys come in.
  EXPECT_EQ(error_of({"parallel.recompute=full*6", "model.layers=6"}), "");
  EXPECT_EQ(load_config("", {"parallel.recompute=selective"}).parallel.recompute_layers(4),
            std::vector<Recompute>(4, Recompute::kSelective));
  // A value that does not parse is listed with the validation's findings, not alone.
  const std::string two = error_of({"parallel.schedule=zb", "parallel.zero=7"});
  EXPECT_NE(two.find("2 problems"), std::string::npos) << two;
}

TEST(Config, FileSyntaxErrorNamesLine) {
  const std::string path = ::testing::TempDir() + "/bad.toml";
  std::ofstream(path) << "[train]\nsteps = 10\nbatch = = 3\n";
  try {
    load_config(path, {});
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_config("/nonexistent/loom.toml", {}), ConfigError);
}

}  // namespace
}  // namespace loom

// Note [Model given by shape] (issue 24): a width without a preset gets the architecture's
// ffn, not tiny's 512, and every key still taken from tiny is named.
TEST(Config, ModelGivenByShapeDerivesFfnAndNamesTinyDefaults) {
  const loom::Config g = loom::load_config("", {"model.layers=24", "model.d_model=2048", "model.heads=16"});
  EXPECT_EQ(g.model.ffn, 4 * 2048);
  ASSERT_EQ(g.model.notes.size(), 2u);
  EXPECT_EQ(g.model.notes[0], "model.ffn = 8192 (4 x d_model, GPT)");
  EXPECT_NE(g.model.notes[1].find("model.vocab = 256, model.ctx = 128 from the default preset 'tiny'"),
            std::string::npos) << g.model.notes[1];
  // Llama: 2/3 of 4 d rounded up to 256 gives Llama-2 7B's 11008; kv_heads follows heads.
  const loom::Config l = loom::load_config("", {"model.arch=llama", "model.layers=32", "model.d_model=4096",
                                                "model.heads=32", "model.vocab=32000", "model.ctx=4096"});
  EXPECT_EQ(l.model.ffn, 11008);
  EXPECT_EQ(l.model.kv_heads, 32);
  EXPECT_EQ(l.model.notes.size(), 2u);  // ffn, kv_heads; nothing left from tiny
  // A named preset, or every key given, leaves nothing to say.
  EXPECT_TRUE(loom::load_config("", {"model.preset=gpt2", "model.layers=6"}).model.notes.empty());
  EXPECT_TRUE(loom::load_config("", {}).model.notes.empty());
  const loom::Config full = loom::load_config("", {"model.arch=gpt", "model.layers=2", "model.d_model=64", "model.heads=4",
                                                   "model.ffn=128", "model.vocab=256", "model.ctx=32"});
  EXPECT_TRUE(full.model.notes.empty());
  EXPECT_EQ(full.model.ffn, 128);
}
