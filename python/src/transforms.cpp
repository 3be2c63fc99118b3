// kiln's Python module: eval, grad, vjp, jit and the lazy mode over Python
// functions.
#include "common.h"

namespace kiln_python {

// ---- Python functions called from kiln ---------------------------------------

kiln::VectorFn vector_fn(nb::callable fn) {
  auto holder = std::make_shared<PyFn>(std::move(fn));
  return [holder](const std::vector<Array>& args) {
    nb::gil_scoped_acquire gil;
    nb::object out = holder->fn(args);
    return nb::cast<std::vector<Array>>(out);
  };
}

nb::dict stats_dict(const kiln::CacheStats& s) {
  nb::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["compiles"] = s.compiles;
  d["evictions"] = s.evictions;
  d["replays"] = s.replays;
  return d;
}

nb::dict compile_dict(const kiln::CompileStats& s) {
  nb::dict d;
  d["nodes_traced"] = s.nodes_traced;
  d["nodes_compiled"] = s.nodes_compiled;
  d["arena_bytes"] = s.arena_bytes;
  d["intermediate_bytes"] = s.intermediate_bytes;
  d["inplace"] = s.inplace;
  d["donated"] = s.donated;
  d["nodes_folded"] = s.nodes_folded;
  d["folded_bytes"] = s.folded_bytes;
  d["compile_ms"] = s.compile_ms;
  return d;
}

// A jitted Python function. The Python function usually reaches back to
// whatever holds this object (a module's globals), a reference cycle through
// C++ that Python's garbage collector sees only through tp_traverse and
// breaks with tp_clear: so the function is held here, where both reach it.
struct PyJitted {
  std::shared_ptr<PyFn> fn;
  kiln::Jitted jitted;
  // One call at a time: the compiled forms and their memory are the
  // function's own (recursive: a traced function may call it again).
  std::recursive_mutex mu;
  PyJitted(nb::callable f, kiln::JitOptions opt)
      : fn(std::make_shared<PyFn>(std::move(f))), jitted(traced_fn(fn), std::move(opt)) {}

  static kiln::VectorFn traced_fn(std::shared_ptr<PyFn> holder) {
    return [holder](const std::vector<Array>& args) {
      nb::gil_scoped_acquire gil;
      if (!holder->fn.is_valid()) kiln::fail("jit", "the jitted function was freed");
      return nb::cast<std::vector<Array>>(holder->fn(args));
    };
  }
};

int jitted_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  PyJitted* j = nb::inst_ptr<PyJitted>(self);
  Py_VISIT(j->fn->fn.ptr());
  return 0;
}

int jitted_clear(PyObject* self) {
  PyJitted* j = nb::inst_ptr<PyJitted>(self);
  j->fn->fn.reset();
  return 0;
}

PyType_Slot jitted_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(jitted_traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(jitted_clear)},
                              {0, nullptr}};

struct Lazy {
  std::unique_ptr<kiln::LazyScope> scope;
};

// The bindings of the module's types: errors, dtypes, devices and arrays.

void bind_transforms(nb::module_& m) {
  // ---- evaluation and transformations ----
  m.def(
      "eval", [](const std::vector<Array>& xs) { kiln::eval(xs); }, "arrays"_a, NoGil(),
      kiln_doc("eval"));
  m.def(
      "mark_step",
      [](const std::vector<Array>& xs) {
        static std::mutex mu;  // the lazy mode's executable cache is the process's
        std::lock_guard lock(mu);
        kiln::mark_step(xs);
      },
      "arrays"_a, NoGil(), kiln_doc("mark_step"));
  m.def(
      "lazy_cache_stats", [] { return stats_dict(kiln::lazy_cache_stats()); },
      kiln_doc("lazy_cache_stats"));
  m.def("is_lazy", &kiln::is_lazy, kiln_doc("is_lazy"));
  nb::class_<Lazy>(m, "_LazyScope")
      .def(nb::init<>())
      .def("__enter__",
           [](Lazy& l) {
             if (l.scope) kiln::fail("lazy", "this scope is entered already");
             l.scope = std::make_unique<kiln::LazyScope>();
           })
      .def("__exit__", [](Lazy& l, nb::args) { l.scope.reset(); });

  m.def(
      "_value_and_grad",
      [](nb::callable fn, const std::vector<Array>& primals) {
        auto holder = std::make_shared<PyFn>(std::move(fn));
        auto f = [holder](const std::vector<Array>& p) {
          nb::gil_scoped_acquire gil;
          return nb::cast<Array>(holder->fn(p));
        };
        nb::gil_scoped_release release;
        return kiln::value_and_grad_vector(f, primals);
      },
      "fn"_a, "primals"_a,
      "fn(primals) -> scalar Array; returns (value, gradients of each primal).");
  m.def(
      "_vjp",
      [](nb::callable fn, const std::vector<Array>& primals, const std::vector<Array>& cts) {
        auto f = vector_fn(std::move(fn));
        nb::gil_scoped_release release;
        return kiln::vjp(f, primals, cts);
      },
      "fn"_a, "primals"_a, "cotangents"_a,
      "fn(primals) -> list of Arrays; returns (outputs, cotangents of the primals).");

  nb::class_<PyJitted>(m, "_Jitted", nb::type_slots(jitted_slots))
      .def(
          "__init__",
          [](PyJitted* j, nb::callable fn, std::vector<int> donate, size_t capacity) {
            new (j) PyJitted(std::move(fn), kiln::JitOptions{std::move(donate), capacity});
          },
          "fn"_a, "donate"_a = std::vector<int>{}, "cache_capacity"_a = 8)
      .def(
          "__call__",
          [](PyJitted& j, const std::vector<Array>& args) {
            std::lock_guard lock(j.mu);
            return j.jitted(args);
          },
          "args"_a, NoGil())
      .def("cache_stats", [](const PyJitted& j) { return stats_dict(j.jitted.cache_stats()); })
      .def("last_compile", [](const PyJitted& j) { return compile_dict(j.jitted.last_compile()); });
}

// The bindings of random keys and draws.

}  // namespace kiln_python
