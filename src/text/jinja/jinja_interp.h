#pragma once
// Tree-walking interpreter of a parsed template, with Jinja's scoping: `for` bodies and macros
// get their own scope, `if` does not; `set` writes to the innermost scope; namespaces are the
// only mutable objects.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/jinja.h"
#include "text/jinja/jinja_ast.h"

namespace ellm::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value);
};

class Interpreter {
 public:
  Interpreter(const std::string& name, const Limits& limits);
  ~Interpreter();

  std::string run(const Body& body, const std::vector<std::pair<std::string, Value>>& variables);

  // Used by the builtins.
  Value call(const Value& callee, CallArgs& args);
  Value filter(const std::string& name, const Value& input, CallArgs& args);
  bool test(const std::string& name, const Value& input, CallArgs& args);
  void charge(size_t work);                   // counts toward max_steps
  void check_size(size_t bytes) const;        // a string about to be built
  void check_items(size_t items) const;       // a list about to be built
  const Limits& limits() const { return limits_; }
  Value new_namespace();

 private:
  enum class Flow { Normal, Break, Continue };

  const std::string& name_;
  Limits limits_;
  uint64_t steps_ = 0;
  int depth_ = 0;
  std::string* out_ = nullptr;
  std::shared_ptr<Scope> scope_;
  std::shared_ptr<Scope> root_;
  std::vector<std::weak_ptr<Dict>> namespaces_;  // cleared at the end to break cycles
  const Value* filter_input_ = nullptr;           // the body text inside {% filter %}

  struct DepthGuard {
    Interpreter& in;
    explicit DepthGuard(Interpreter& i);
    ~DepthGuard() { --in.depth_; }
  };

  void write(const std::string& s);
  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  void define_macro(const Stmt& s);
  void exec_call_block(const Stmt& s);
  std::string capture(const Body& body, const std::shared_ptr<Scope>& scope);
  void assign(const Expr& target, const Value& value, Scope& scope);

  Value eval(const Expr& e);
  Value eval_node(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e);
  Value eval_slice(const Expr& e);
  void eval_args(const Expr& e, CallArgs& args);
  Value make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope, const std::string& name);
};

// Builtins (jinja_builtins.cc, jinja_filters.cc).
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);
Value apply_filter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
Value get_attr(const Value& object, const std::string& name);   // obj.name
Value get_item(const Value& object, const Value& key);          // obj[key]
bool contains(const Value& container, const Value& item);       // item in container
List iterate(const Value& v);                                   // for x in v
size_t length(const Value& v);                                  // |length
std::vector<std::pair<std::string, Value>> make_globals(Interpreter& in);
[[noreturn]] void undefined_error(const Value& undefined);

}  // namespace ellm::jinja
