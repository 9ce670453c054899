// The config keys: one table with a row per key (its dotted name, the Config member it sets, its range or
// allowed values, what its default stands for and what it means).
//
// Everything that knows a key reads it from this table: the YAML walk and `--set` in Config.cpp (a name that
// is not a row is an unknown key, answered with the nearest row), the effective values a checkpoint records,
// and `strata config --list`, whose output is docs/configuration.md. A key is added by adding a row here
// (src/config/ConfigKeys.cpp) and the member it sets in Config.h; checks that span several keys stay in
// Config.cpp's validation.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace strata::config {

struct Config;

// The member of a Config a key sets; the alternative held is the key's type.
using ConfigMember = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<double>*>;

// A number's range without an upper end.
inline constexpr double kConfigNoMax = 1e18;

struct ConfigKey {
  std::string name;                  // dotted, as `--set` takes it: "train.micro_batch_size"
  ConfigMember (*member)(Config&);   // the member it sets (and reads back)
  std::string doc;                   // what it means, in one line
  std::vector<std::string> choices;  // a string key's allowed values (empty: any string)
  // Numbers (each element of a list) lie in [min, max]; a max of kConfigNoMax or more has no upper end.
  double min = 0, max = kConfigNoMax;
  // What the default stands for when another key or the architecture decides it ("= seq_length").
  std::string derivedDefault;
  // The type as the reference states it when the member's type says too little (a string holding a number
  // of GiB or `auto`); Config.cpp's validation checks such keys.
  std::string type;
};

// A top-level group of keys ("model") and what it holds.
struct ConfigSection {
  std::string name, doc;
};

// Every key, grouped by section in the order of configSections().
const std::vector<ConfigKey>& configKeyTable();
const std::vector<ConfigSection>& configSections();
// The row of `name`, or null.
const ConfigKey* findConfigKey(const std::string& name);
// Whether `name` holds keys below it ("model", "zero_optimization.aio").
bool isConfigSection(const std::string& name);
// A key's value in `config` as YAML text: what effectiveValues records and a checkpoint's manifest holds.
std::string configValueText(const ConfigKey& key, const Config& config);
// What values a key takes, for errors: "an integer", "a number", "a string", "true or false", ...
std::string configTypeName(const ConfigKey& key);
// The known key or section nearest to an unknown `name`: a typo of a dotted name, or a key under the wrong
// section (the last component compared alone). Empty when nothing is near.
std::string nearestConfigKey(const std::string& name);
// Every key as a Markdown document, a section per top-level group with a table of key, type, default and
// meaning: what `strata config --list` prints and docs/configuration.md holds.
std::string configReference();

}  // namespace strata::config
