// kiln's Python module (kiln._kiln): arrays, ops and transformations over
// libkiln with nanobind. The Python files of python/kiln/ build the public
// interface (trees, keyword arguments, indexing) over these functions.
//
// The GIL: every call that can run kernels (an op in eager mode, eval, a
// jitted call, a transformation) releases it; a Python function that kiln
// calls back (a traced or differentiated function) takes it again, and an
// exception it raises travels through kiln's C++ code back to the caller
// unchanged.
#include "common.h"

using namespace kiln_python;

NB_MODULE(_kiln, m) {
  m.doc() = "kiln's C++ engine (use the kiln package, which builds on this module)";
  bind_arrays(m);
  bind_ops(m);
  bind_reductions_layout(m);
  bind_transforms(m);
  bind_random(m);
  bind_nn_io(m);
  bind_io(m);
  bind_layers(m);
  bind_models(m);
  bind_optim(m);
  bind_data(m);
  bind_train(m);
}
