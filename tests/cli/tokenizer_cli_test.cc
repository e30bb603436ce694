// `loom tokenizer` as a user runs it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/loom_cli.h"

namespace fs = std::filesystem;
using loom::testing_support::expect_usage_error;
using loom::testing_support::run_loom;

namespace {

const std::string kTok = std::string(LOOM_FIXTURE_DIR) + "/tokenizers";

TEST(TokenizerCli, EncodesAndDecodesGpt2) {
  auto r = run_loom("tokenizer encode --tokenizer " + kTok + "/gpt2 --text 'Hello world<|endoftext|>' --json");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "[15496,995,50256]\n");
  r = run_loom("tokenizer encode --tokenizer " + kTok + "/gpt2 --text '<|endoftext|>' --plain");
  EXPECT_EQ(r.output, "27 91 437 1659 5239 91 29\n");
  r = run_loom("tokenizer decode --tokenizer " + kTok + "/gpt2 --ids '[15496, 995, 50256]'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "Hello world<|endoftext|>");
  r = run_loom("tokenizer info --tokenizer " + kTok + "/gpt2 --json");
  EXPECT_NE(r.output.find("\"vocab_size\":50257"), std::string::npos) << r.output;
}

TEST(TokenizerCli, TrainsALosslessSentencePieceModelAndKeepsAnExistingOne) {
  const fs::path dir = fs::temp_directory_path() / ("loom-tokcli-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string model = (dir / "t.model").string();
  auto r = run_loom("tokenizer train --vocab 600 --in " + kTok + "/sample.txt --out " + model);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("vocab 600"), std::string::npos) << r.output;
  r = run_loom("tokenizer encode --tokenizer " + model + " --in " + kTok + "/sample.txt > " + (dir / "ids").string());
  r = run_loom("tokenizer decode --tokenizer " + model + " --in " + (dir / "ids").string() + " | cmp - " + kTok +
               "/sample.txt && echo same");
  EXPECT_EQ(r.output, "same\n");
  expect_usage_error("tokenizer train --vocab 600 --in " + kTok + "/sample.txt --out " + model, "pass --overwrite");
  r = run_loom("tokenizer train --vocab 600 --in " + kTok + "/sample.txt --out " + model + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.output;
  fs::remove_all(dir);
}

TEST(TokenizerCli, RefusesBadInputsNamingThem) {
  expect_usage_error("tokenizer train --vocab 10 --in " + kTok + "/sample.txt --out /tmp/x.model", "--vocab 10 is outside");
  expect_usage_error("tokenizer train --out /tmp/x.txt", "must end in .model");
  expect_usage_error("tokenizer decode --tokenizer byte --ids '1 two'", "'two' at offset 2 is not a token id");
  expect_usage_error("tokenizer encode --tokenizer byte", "--text S or --in FILE");
  auto r = run_loom("tokenizer encode --tokenizer /nonexistent --text hi");
  EXPECT_EQ(r.code, 2);  // a path that does not exist is a usage error everywhere (issue 59)
  EXPECT_NE(r.output.find("tokenizer '/nonexistent' does not exist"), std::string::npos) << r.output;
  r = run_loom("tokenizer decode --tokenizer byte --ids 300");
  EXPECT_NE(r.output.find("token id 300 is not a byte"), std::string::npos) << r.output;
}

TEST(DataCli, PreparesInspectsAndRefusesDamage) {
  const fs::path dir = fs::temp_directory_path() / ("loom-datacli-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string out = (dir / "shards").string();
  auto r = run_loom("data prepare --tokenizer " + kTok + "/gpt2 --in " + kTok + "/sample.txt --out " + out +
                    " --val-fraction 0");
  EXPECT_EQ(r.code, 0) << r.output;
  // 592 ids with special tokens kept as text (as OpenAI's encoder gives) + <|endoftext|>
  EXPECT_NE(r.output.find("train 1 docs, 593 tokens"), std::string::npos) << r.output;
  r = run_loom("data inspect " + out + " --json");
  EXPECT_NE(r.output.find("\"tokens\":593"), std::string::npos) << r.output;
  expect_usage_error("data prepare --tokenizer byte --in " + kTok + "/sample.txt --out " + out + " --val-fraction 0",
                     "pass --overwrite");
  r = run_loom("data prepare --tokenizer byte --in " + kTok + "/sample.txt --out " + out + " --val-fraction 0 --overwrite");
  EXPECT_EQ(r.code, 0) << r.output;
  fs::resize_file(out + "/train_00000.bin", fs::file_size(out + "/train_00000.bin") - 1);
  r = run_loom("data inspect " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("the file is truncated"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// The default job's path: shards + data.tokenizer -> train -> sample decodes with that
// tokenizer; a different tokenizer is refused at train and at sample time.
TEST(DataCli, TrainsOnShardsAndSamplesWithTheirTokenizer) {
  const fs::path dir = fs::temp_directory_path() / ("loom-shardcli-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string sp = kTok + "/fortunes-1k.model", shards = (dir / "shards").string(), ck = (dir / "ck").string();
  auto r = run_loom("data prepare --tokenizer " + sp + " --in /usr/share/games/fortunes/people --out " + shards +
                    " --doc-separator %");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string model = " --set model.preset=tiny --set model.layers=1 --set model.vocab=1000 --set model.ctx=32"
                            " --set train.batch=4 --set train.steps=2 --set train.val_batches=1";
  r = run_loom("train --set data.shards=" + shards + " --set data.tokenizer=" + sp + model +
               " --set checkpoint.dir=" + ck + " --json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"val_bpb\""), std::string::npos) << r.output;
  r = run_loom("sample --checkpoint " + ck + " --prompt 'The ' --tokens 20 --temperature 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_GT(r.output.size(), 5u) << r.output;
  r = run_loom("sample --checkpoint " + ck + " --tokenizer " + kTok + "/gpt2 --tokens 5");
  EXPECT_NE(r.output.find("is larger than the model's (model.vocab = 1000)"), std::string::npos) << r.output;
  expect_usage_error("train --set data.shards=" + shards + " --set data.tokenizer=" + kTok + "/gpt2" + model +
                         " --set checkpoint.dir=" + (dir / "ck2").string(),
                     "is not the tokenizer that wrote data.shards");
  // Exported and imported with --tokenizer, the model samples the same text.
  const std::string st = (dir / "m.safetensors").string(), imp = (dir / "imported").string();
  r = run_loom("export --checkpoint " + ck + " --out " + st);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_loom("import --in " + st + " --checkpoint " + imp + " --tokenizer " + sp);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto a = run_loom("sample --checkpoint " + ck + " --prompt 'The ' --tokens 20 --temperature 0");
  const auto b = run_loom("sample --checkpoint " + imp + " --prompt 'The ' --tokens 20 --temperature 0");
  EXPECT_EQ(b.code, 0) << b.output;
  EXPECT_EQ(a.output, b.output);
  expect_usage_error("import --in " + st + " --checkpoint " + (dir / "imp2").string() + " --tokenizer " + kTok +
                         "/gpt2",
                     "has 50257 tokens but the imported model's vocabulary is 1000");
  fs::remove_all(dir);
}

// An HF-layout Llama (random weights, no loom metadata) imported with its SentencePiece
// tokenizer continues a prompt exactly as PyTorch did with HF conventions
// (tests/reference/write_import_fixture.py wrote the file and the expected text).
TEST(DataCli, AnImportedHfModelSamplesWithItsOwnTokenizerAsPyTorchDoes) {
  const auto want = nlohmann::json::parse(std::ifstream(kTok + "/hf-llama-tiny.json"));
  const fs::path dir = fs::temp_directory_path() / ("loom-hfimport-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string ck = (dir / "ck").string();
  fs::create_directories(dir);
  auto r = run_loom("import --in " + kTok + "/hf-llama-tiny.safetensors --checkpoint " + ck + " --tokenizer " + kTok +
                    "/fortunes-1k.model --set model.preset=llama --set model.heads=4 --set model.kv_heads=2"
                    " --set model.ctx=64");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_loom("sample --checkpoint " + ck + " --prompt '" + want["prompt"].get<std::string>() + "' --tokens " +
               std::to_string(want["continuation_ids"].size()) + " --temperature 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, want["text"].get<std::string>() + "\n");
  fs::remove_all(dir);
}

// Note [Hugging Face directories]: the same model as a directory - config.json, the weights
// (the fixture's file, no loom metadata) and tokenizer.model - imports with no flag at all
// and samples the same text; exporting it writes the tokenizer file beside the weights.
TEST(DataCli, AnHfModelDirectoryImportsWithoutFlagsAndExportsItsTokenizer) {
  const auto want = nlohmann::json::parse(std::ifstream(kTok + "/hf-llama-tiny.json"));
  const fs::path dir = fs::temp_directory_path() / ("loom-hfdir-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string ck0 = (dir / "ck0").string(), hf = (dir / "hf").string(), ck = (dir / "ck").string();
  auto r = run_loom("import --in " + kTok + "/hf-llama-tiny.safetensors --checkpoint " + ck0 + " --tokenizer " + kTok +
                    "/fortunes-1k.model --set model.preset=llama --set model.heads=4 --set model.kv_heads=2"
                    " --set model.ctx=64");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_loom("export --checkpoint " + ck0 + " --out " + hf);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::is_regular_file(hf + "/config.json"));
  ASSERT_TRUE(fs::is_regular_file(hf + "/tokenizer.model")) << "the checkpoint's tokenizer goes with the weights";
  fs::copy_file(kTok + "/hf-llama-tiny.safetensors", hf + "/model.safetensors", fs::copy_options::overwrite_existing);
  r = run_loom("import --in " + hf + " --checkpoint " + ck);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_loom("sample --checkpoint " + ck + " --prompt '" + want["prompt"].get<std::string>() + "' --tokens " +
               std::to_string(want["continuation_ids"].size()) + " --temperature 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, want["text"].get<std::string>() + "\n");
  fs::remove_all(dir);
}

}  // namespace
