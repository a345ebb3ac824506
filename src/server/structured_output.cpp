#include "server/structured_output.h"

#include <algorithm>
#include <utility>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace kiln::server {

using grammar::Element;
using grammar::Grammar;
using grammar::Sequence;

namespace {

Sequence lit(std::string_view s) { return Grammar::literal(s); }

Sequence cat(std::initializer_list<Sequence> parts) { return Grammar::cat(parts); }

// A grammar whose sentences are exactly `choices` (at least one).
Grammar choice_grammar(const std::vector<std::string>& choices) {
  Grammar g;
  std::vector<Sequence> alts;
  for (const std::string& c : choices) alts.push_back(lit(c));
  g.set_start(g.add_rule("choice", std::move(alts)));
  return g;
}

}  // namespace

std::optional<Grammar> read_output_format(Fields& f, bool llama_cpp_fields) {
  std::optional<Grammar> g;
  const char* given = nullptr;  // the field that set g
  const auto set = [&](Result<Grammar> r, const char* field, const std::string& where) {
    if (given != nullptr) {
      f.fail(std::string("give '") + given + "' or '" + field + "', not both", field);
    } else if (!r.ok()) {
      f.fail("'" + where + "': " + r.status().message(), field);
    } else {
      g = std::move(r).value();
      given = field;
    }
  };
  const auto from_schema = [&](const ordered_json& schema, const char* field, const std::string& where) {
    if (schema.is_boolean() && schema.get<bool>()) set(grammar::json_value_grammar(), field, where);
    else if (!schema.is_object()) f.fail("'" + where + "' must be a JSON schema object", field);
    else set(grammar::json_schema_to_grammar(schema), field, where);
  };
  if (const ordered_json* rf = f.object("response_format")) {
    const ordered_json type = rf->value("type", ordered_json());
    if (!type.is_string()) {
      f.fail("'response_format.type' must be a string", "response_format");
    } else if (type == "json_object") {
      set(grammar::json_object_grammar(), "response_format", "response_format");
    } else if (type == "json_schema") {
      const ordered_json js = rf->value("json_schema", ordered_json());
      if (!js.is_object() || !js.contains("schema")) f.fail("'response_format.json_schema.schema' is required", "response_format");
      else from_schema(js["schema"], "response_format", "response_format.json_schema.schema");
    } else if (type != "text") {
      f.fail("response_format type '" + type.get<std::string>() + "' is not supported (text, json_object, json_schema)",
             "response_format");
    }
  }
  if (const ordered_json* so = f.object("structured_outputs"); so != nullptr && !f.failed()) {
    if (!so->is_object()) {
      f.fail("'structured_outputs' must be an object with one of json, regex, choice, grammar", "structured_outputs");
      return g;
    }
    int kinds = 0;
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      const std::string where = "structured_outputs." + key;
      if (key == "json") {
        ++kinds;
        if (value.is_string()) set(grammar::json_schema_text_to_grammar(value.get<std::string>()), "structured_outputs", where);
        else from_schema(value, "structured_outputs", where);
      } else if (key == "regex") {
        ++kinds;
        if (!value.is_string()) f.fail("'" + where + "' must be a string", "structured_outputs");
        else set(grammar::regex_to_grammar(value.get<std::string>()), "structured_outputs", where);
      } else if (key == "choice") {
        ++kinds;
        std::vector<std::string> choices;
        if (value.is_array())
          for (const ordered_json& c : value)
            if (c.is_string()) choices.push_back(c.get<std::string>());
        if (!value.is_array() || choices.empty() || choices.size() != value.size())
          f.fail("'" + where + "' must be a non-empty list of strings", "structured_outputs");
        else set(choice_grammar(choices), "structured_outputs", where);
      } else if (key == "grammar") {
        ++kinds;
        if (!value.is_string()) f.fail("'" + where + "' must be a GBNF grammar (a string)", "structured_outputs");
        else set(grammar::gbnf_to_grammar(value.get<std::string>()), "structured_outputs", where);
      } else if (key == "structural_tag") {
        f.fail("'" + where + "' is not supported by this server (json, regex, choice and grammar are)",
               "structured_outputs");
      } else if (key == "json_object") {
        ++kinds;
        if (value == true) set(grammar::json_object_grammar(), "structured_outputs", where);
      } else if (key != "disable_any_whitespace" && key != "disable_fallback" && key != "disable_additional_properties" &&
                 key != "whitespace_pattern") {
        f.fail("'structured_outputs' has an unknown field '" + key + "' (json, regex, choice, grammar)",
               "structured_outputs");
      }
      if (f.failed()) return g;
    }
    if (kinds > 1) f.fail("'structured_outputs' takes one of json, regex, choice, grammar", "structured_outputs");
  }
  if (llama_cpp_fields && f.has("json_schema") && !f.failed())
    from_schema(f.at("json_schema"), "json_schema", "json_schema");
  if (llama_cpp_fields && f.has("grammar") && !f.failed()) {
    if (!f.at("grammar").is_string()) f.fail("'grammar' must be a GBNF grammar (a string)", "grammar");
    else set(grammar::gbnf_to_grammar(f.at("grammar").get<std::string>()), "grammar", "grammar");
  }
  return g;
}

namespace {

// A function's arguments: its parameter schema as a grammar, or any JSON object.
Result<Grammar> arguments_grammar(const ordered_json& fn) {
  const ordered_json params = fn.value("parameters", ordered_json());
  if (!params.is_object()) return grammar::json_object_grammar();
  Result<Grammar> g = grammar::json_schema_to_grammar(params);
  if (g.ok()) return g;
  if (fn.value("strict", false)) {
    return invalid_argument("function '" + fn.value("name", std::string()) + "' parameters: " + g.status().message());
  }
  return grammar::json_object_grammar();  // a loose schema kiln cannot enforce: any object
}


// How a family spells one argument: OPEN KEY (CLOSE_STRING | CLOSE_OTHER) VALUE VALUE_CLOSE,
// CLOSE_STRING before a raw string value and CLOSE_OTHER before a JSON one.
struct ArgumentSyntax {
  std::string_view open, key_stop, close_string, close_other, value_stop, value_close;
};

// GLM-4.5: `<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n`, string values raw and the
// others as JSON (its template's `v | tojson if v is not string`).
constexpr ArgumentSyntax kGlmArguments = {"<arg_key>", "</arg_key>", "</arg_key>\n<arg_value>",
                                          "</arg_key>\n<arg_value>", "</arg_value>", "</arg_value>\n"};
// DeepSeek-V3.2 DSML: `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n`.
constexpr ArgumentSyntax kDsmlArguments = {"<｜DSML｜parameter name=\"", "\"", "\" string=\"true\">",
                                           "\" string=\"false\">", "</｜DSML｜parameter>",
                                           "</｜DSML｜parameter>\n"};

// A function's arguments in `syntax`: declared properties in order, required ones always,
// string values raw (no value_stop inside) and the others as JSON following their schema.
Result<Sequence> tagged_arguments(Grammar& g, const ordered_json& fn, const ArgumentSyntax& syntax) {
  const ordered_json params = fn.value("parameters", ordered_json());
  const ordered_json props = params.is_object() ? params.value("properties", ordered_json()) : ordered_json();
  const bool typed = syntax.close_string != syntax.close_other;
  const auto free_value = [&]() -> Sequence {  // a value of any type
    const Element text = g.text_without("arg_text", syntax.value_stop);
    if (!typed) return {text};
    return {g.alternation("arg_any", {cat({lit(syntax.close_string), {text}}),
                                      cat({lit(syntax.close_other), {g.embed(grammar::json_value_grammar())}})})};
  };
  const auto argument = [&](Sequence key, Sequence value) {
    return cat({lit(syntax.open), std::move(key), std::move(value), lit(syntax.value_close)});
  };
  if (!props.is_object() || props.empty()) {  // any keys: free text for both
    Sequence any = argument({g.text_without("arg_key", syntax.key_stop)},
                            cat({typed ? Sequence{} : lit(syntax.close_string), free_value()}));
    return Sequence{g.star("args", std::move(any))};
  }
  const ordered_json required = params.value("required", ordered_json::array());
  Sequence out;
  for (const auto& [key, schema] : props.items()) {
    Sequence value;
    if (!schema.is_object()) {
      value = cat({typed ? Sequence{} : lit(syntax.close_string), free_value()});
    } else if (schema.value("type", ordered_json()) == "string") {  // raw: an enum's words, or free text
      std::vector<Sequence> words;
      for (const ordered_json& w : schema.contains("const") ? ordered_json::array({schema["const"]})
                                                             : schema.value("enum", ordered_json::array()))
        if (w.is_string()) words.push_back(lit(w.get<std::string>()));
      value = cat({lit(syntax.close_string), words.empty() ? Sequence{g.text_without("arg_text", syntax.value_stop)}
                                                           : Sequence{g.alternation("arg_word", std::move(words))}});
    } else {
      Result<Grammar> v = grammar::json_schema_to_grammar(schema);
      if (!v.ok() && fn.value("strict", false))
        return invalid_argument("function '" + fn.value("name", std::string()) + "' parameter '" + key +
                                "': " + v.status().message());
      value = cat({lit(syntax.close_other), {g.embed(v.ok() ? *v : grammar::json_value_grammar())}});
      if (g.too_large()) return invalid_argument("the tool-call grammar of 'tools': " + grammar::too_large_message());
    }
    Sequence one = argument(lit(key), std::move(value));
    const bool is_required = std::find(required.begin(), required.end(), ordered_json(key)) != required.end();
    if (is_required) out.insert(out.end(), one.begin(), one.end());
    else out.push_back(g.optional("arg", std::move(one)));
  }
  return out;
}

}  // namespace

Result<Grammar> tool_call_grammar(const ToolSyntax& syntax, const ordered_json& tools, const ToolCallRule& rule) {
  using tokenizer::ToolFormat;
  Grammar g;
  std::vector<Sequence> calls;  // one alternative per allowed function
  for (const ordered_json& tool : tools) {
    const ordered_json& fn = tool.contains("function") ? tool["function"] : tool;
    const std::string name = fn.value("name", std::string());
    if (rule.name && name != *rule.name) continue;
    Sequence call;
    if (syntax.format == ToolFormat::kGlm45) {
      KILN_ASSIGN_OR_RETURN(Sequence args, tagged_arguments(g, fn, kGlmArguments));
      call = cat({lit("<tool_call>" + name + "\n"), args, lit("</tool_call>")});
    } else if (syntax.format == ToolFormat::kDeepSeekV32) {
      KILN_ASSIGN_OR_RETURN(Sequence args, tagged_arguments(g, fn, kDsmlArguments));
      call = cat({lit("<｜DSML｜invoke name=\"" + name + "\">\n"), args, lit("</｜DSML｜invoke>")});
    } else {
      KILN_ASSIGN_OR_RETURN(Grammar a, arguments_grammar(fn));
      const Sequence args{g.embed(a)};
      switch (syntax.format) {
        case ToolFormat::kHermes:
          call = cat({lit("<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": "), args, lit("}\n</tool_call>")});
          break;
        case ToolFormat::kKimiK2:
          call = cat({lit("<|tool_call_begin|>functions." + name + ":"),
                      {g.repeat("call_index", {Element::byte_set(grammar::ByteSet::range('0', '9'))}, 1, 3)},
                      lit("<|tool_call_argument_begin|>"), args, lit("<|tool_call_end|>")});
          break;
        case ToolFormat::kDeepSeekV3:
          call = syntax.deepseek_fenced
                     ? cat({lit("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n"), args,
                            lit("\n```<｜tool▁call▁end｜>")})
                     : cat({lit("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>"), args, lit("<｜tool▁call▁end｜>")});
          break;
        case ToolFormat::kHarmony:
          call = cat({lit("<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>"), args,
                      lit("<|call|>")});
          break;
        default:
          return invalid_argument("this model has no tool-call syntax kiln knows, so a tool call cannot be required");
      }
    }
    calls.push_back(std::move(call));
    // The tools' grammars share one budget: stop at the first that spends it.
    if (g.too_large()) return invalid_argument("the tool-call grammar of 'tools': " + grammar::too_large_message());
  }
  if (calls.empty()) {
    return invalid_argument(rule.name ? "tool_choice names function '" + *rule.name + "', which is not in 'tools'"
                                      : std::string("a tool call is required but 'tools' is empty"));
  }
  const Element one = g.alternation("tool_call", std::move(calls));
  // Harmony ends a message at <|call|> (a stop token): one call per reply.
  const bool many = rule.parallel && syntax.format != ToolFormat::kHarmony;
  Sequence block;
  switch (syntax.format) {
    case ToolFormat::kHermes:
    case ToolFormat::kGlm45:
      block = many ? Sequence{one, g.star("more_calls", cat({lit("\n"), {one}}))} : Sequence{one};
      break;
    case ToolFormat::kKimiK2:
      block = cat({lit("<|tool_calls_section_begin|>"), many ? Sequence{g.plus("calls", {one})} : Sequence{one},
                   lit("<|tool_calls_section_end|>")});
      break;
    case ToolFormat::kDeepSeekV3:
      block = cat({lit("<｜tool▁calls▁begin｜>"), many ? Sequence{g.plus("calls", {one})} : Sequence{one},
                   lit("<｜tool▁calls▁end｜>")});
      break;
    case ToolFormat::kDeepSeekV32:  // after the blank line the model puts before its calls
      block = cat({{g.optional("blank_line", lit("\n\n"))}, lit("<｜DSML｜function_calls>\n"),
                   many ? Sequence{one, g.star("more_calls", cat({lit("\n"), {one}}))} : Sequence{one},
                   lit("\n</｜DSML｜function_calls>")});
      break;
    default: block = {one}; break;
  }
  g.set_start(g.add_rule("tool_calls", {std::move(block)}));
  return g;
}

std::optional<Grammar> lazy_tool_call_grammar(const ToolSyntax& syntax, const Grammar& calls) {
  using tokenizer::ToolFormat;
  std::string_view marker;
  switch (syntax.format) {
    case ToolFormat::kHermes:
    case ToolFormat::kGlm45: marker = "<tool_call>"; break;
    case ToolFormat::kKimiK2: marker = "<|tool_calls_section_begin|>"; break;
    case ToolFormat::kDeepSeekV3: marker = "<｜tool▁calls▁begin｜>"; break;
    case ToolFormat::kDeepSeekV32: marker = "<｜DSML｜function_calls>"; break;
    default: return std::nullopt;
  }
  Grammar g;
  const Element text = g.text_without("text", marker);
  const Element block = g.embed(calls);
  g.set_start(g.add_rule("reply", {{text, g.optional("calls", {block})}}));
  return g;
}

Grammar after_reasoning(const Grammar& body, ReasoningFrame frame, bool tool_calls) {
  Grammar g;
  Sequence rest{g.embed(body)};
  // Up to three newlines or spaces between a closed reasoning block and what follows.
  const auto gap = [&] {
    return g.repeat("gap", {Element::byte_set(grammar::ByteSet::of('\n').add(' ', ' '))}, 0, 3);
  };
  switch (frame) {
    case ReasoningFrame::kNone: break;
    case ReasoningFrame::kThinkOpen:
      rest = cat({{g.text_without("reasoning", "</think>")}, lit("</think>"), {gap()}, rest});
      break;
    case ReasoningFrame::kThinkOptional:
      rest = cat({{g.optional("think", cat({lit("<think>"), {g.text_without("reasoning", "</think>")},
                                            lit("</think>"), {gap()}}))},
                  rest});
      break;
    case ReasoningFrame::kHarmony:
      // The analysis message holds no "<|": every harmony marker starts with it, so the
      // first one ends the text.
      if (!tool_calls) rest = cat({lit("<|channel|>final<|message|>"), rest});
      rest = cat({{g.optional("analysis", cat({lit("<|channel|>analysis<|message|>"),
                                               {g.text_without("reasoning", "<|")}, lit("<|end|><|start|>assistant")}))},
                  rest});
      break;
  }
  g.set_start(g.add_rule("reply", {std::move(rest)}));
  return g;
}

const std::vector<std::string>& syntax_markers(tokenizer::ToolFormat format) {
  using tokenizer::ToolFormat;
  static const std::vector<std::string> kNone = {"<think>", "</think>"};
  static const std::vector<std::string> kHermes = {"<think>", "</think>", "<tool_call>", "</tool_call>"};
  static const std::vector<std::string> kGlm = {"<think>",   "</think>",   "<tool_call>",  "</tool_call>",
                                                "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
  static const std::vector<std::string> kKimi = {
      "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
      "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
  static const std::vector<std::string> kDeepSeek = {"<think>", "</think>", "<｜tool▁calls▁begin｜>",
                                                     "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                                                     "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"};
  // V3.2's DSML tags are text; "｜DSML｜" in case a tokenizer makes it a special token.
  static const std::vector<std::string> kDsml = {"<think>", "</think>", "｜DSML｜"};
  static const std::vector<std::string> kHarmony = {"<|channel|>", "<|message|>", "<|end|>", "<|start|>",
                                                    "<|constrain|>", "<|call|>"};
  switch (format) {
    case ToolFormat::kHermes: return kHermes;
    case ToolFormat::kGlm45: return kGlm;
    case ToolFormat::kKimiK2: return kKimi;
    case ToolFormat::kDeepSeekV3: return kDeepSeek;
    case ToolFormat::kDeepSeekV32: return kDsml;
    case ToolFormat::kHarmony: return kHarmony;
    case ToolFormat::kNone: break;
  }
  return kNone;
}

}  // namespace kiln::server
