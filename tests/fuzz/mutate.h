// Mutations of JSON documents for the fuzz targets: structural ones on the parsed tree (delete, duplicate and
// rename keys, change types, extreme numbers, huge or broken strings, deep nesting, new members), then
// sometimes byte-level ones on the text (bit flips, deletions, truncation, splices).
//
// Some mutations produce text a JSON library cannot hold in a tree (duplicate keys, 2^64, NaN, raw control
// characters, invalid UTF-8, 100 000 levels of nesting): the tree holds a placeholder string and the raw text
// replaces it after serialisation.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fuzz/rng.h"

namespace hzp::fuzz {

class JsonMutator {
 public:
  // `seeds`: documents to mutate and to splice from. Keys and string values seen in them become the
  // vocabulary of renames and new members (so that mutations reach past "unknown key" errors).
  void add_seed(const std::string& text);
  std::size_t seed_count() const { return seeds_.size(); }

  // A mutation of a random seed: half of the time "wild" (mutate_document), half of the time "semantic":
  // values seen under the same key in the seeds, numbers doubled, halved or nudged, optional members added
  // or removed. Semantic mutations mostly keep a scenario valid, so they reach the scheduler and the
  // estimator; wild ones mostly test the parser.
  std::string generate(Rng& rng) const;
  // A mutation of `doc` (structural, then sometimes byte-level).
  std::string mutate_document(Rng& rng, const nlohmann::json& doc) const;
  // Byte-level mutations of `text` (1 to 3 of them).
  void mutate_bytes(Rng& rng, std::string& text) const;

 private:
  struct Seed {
    std::string text;
    bool parsed = false;
    nlohmann::json doc;
  };
  struct Raw;  // the placeholder table of one mutation
  void mutate_tree(Rng& rng, nlohmann::json& doc, Raw& raw) const;
  void mutate_semantic(Rng& rng, nlohmann::json& doc) const;
  std::string random_string_value(Rng& rng, Raw& raw) const;
  nlohmann::json random_value(Rng& rng, Raw& raw, int depth) const;

  std::vector<Seed> seeds_;
  std::vector<std::string> keys_;     // every object key seen in the seeds
  std::vector<std::string> strings_;  // every string value seen in the seeds
  // "parent/key" -> the distinct values seen under that key of an object under that parent key
  std::map<std::string, std::vector<nlohmann::json>> values_by_key_;
  // parent key -> the distinct (key, value) members seen in objects under it
  std::map<std::string, std::vector<std::pair<std::string, nlohmann::json>>> members_by_parent_;
};

// Raw JSON texts of numbers that sit on the edges of int32, int64, uint64 and double, and of
// not-quite-numbers ("NaN", "1e", "0x10", "01").
const std::vector<std::string>& extreme_number_texts();

// A JSON value nested `depth` levels deep: arrays, objects, or a mix.
std::string deep_nesting(Rng& rng, std::size_t depth);

}  // namespace hzp::fuzz
