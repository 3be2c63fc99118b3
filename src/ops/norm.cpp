// kiln ops: batch normalization and group normalization (PyTorch's
// BatchNorm1d/2d and GroupNorm), composed of reductions and elementwise
// primitives: their gradients are those primitives' VJPs, and a compiled
// step fuses them.
#include <string>

#include "kiln/ops.h"

namespace kiln {
namespace {

// The shape that broadcasts a per-channel [C] array against x.
Shape channel_shape(const Array& x, int axis) {
  Shape s(x.ndim(), 1);
  s[axis] = x.shape()[axis];
  return s;
}

void require_channels(const Array& a, const char* what, int64_t c, const char* op) {
  if (a.valid() && (a.ndim() != 1 || a.shape()[0] != c))
    fail(op, std::string(what) + " " + str(a.shape()) + ": expected (" + std::to_string(c) +
                 "), one value per channel");
}

}  // namespace

BatchNormResult batch_norm(const Array& x, const Array& gamma, const Array& beta,
                           const Array& running_mean, const Array& running_var,
                           const BatchNormOptions& opt) {
  const char* op = "batch_norm";
  if (!x.valid()) fail(op, "the input is an empty Array handle");
  if (x.ndim() < 2)
    fail(op, "input " + str(x.shape()) + ": expected rank 2 or more, [batch, channels, ...]");
  if (!is_floating(x.dtype()) || x.dtype() == DType::f16)
    fail(op, std::string("input is ") + name_of(x.dtype()) + ", expected f32, f64 or bf16");
  const int axis = opt.channels_last ? static_cast<int>(x.ndim()) - 1 : 1;
  const int64_t c = x.shape()[axis];
  require_channels(gamma, "weight", c, op);
  require_channels(beta, "bias", c, op);
  require_channels(running_mean, "running_mean", c, op);
  require_channels(running_var, "running_var", c, op);
  if (running_mean.valid() != running_var.valid())
    fail(op, "running_mean and running_var come together: one of them is missing");
  const bool batch_stats = opt.training || !running_mean.valid();
  std::vector<int> axes;
  for (int i = 0; i < static_cast<int>(x.ndim()); ++i)
    if (i != axis) axes.push_back(i);
  const int64_t n = c ? x.size() / c : 0;
  const Shape bc = channel_shape(x, axis);
  BatchNormResult r;
  Array mu, var;
  if (batch_stats) {
    if (opt.training && n < 2)
      fail(op, "input " + str(x.shape()) +
                   " has 1 value per channel: training needs more than one (PyTorch's rule)");
    // Written so that the backward pass reduces over x twice, sum(dy) and
    // sum(dy * (x - mu)), rather than four times (each reduction a pass over
    // the activations, a ResNet's costliest memory traffic):
    // - the variance reads x - sg(mu): d var / d mu = -2 mean(x - mu) is 0,
    //   so its gradient reaches x directly, not through mu by a sum;
    // - y = (x - sg(mu)) * scale + shift, with shift = beta - scale * (mu -
    //   sg(mu)), which is beta in value: mu's gradient, -scale * sum(dy),
    //   comes from shift's gradient sum(dy), which beta's is, rather than
    //   from a third reduction sum(dy * scale).
    mu = mean(x, axes, true);
    const Array mu_held = stop_gradient(mu);
    const Array centred = x - mu_held;
    var = mean(centred * centred, axes, true);
    Array scale = rsqrt(var + opt.eps);
    if (gamma.valid()) scale = scale * reshape(astype(gamma, x.dtype()), bc);
    const Array zero = (mu - mu_held) * scale;
    const Array shift = beta.valid() ? reshape(astype(beta, x.dtype()), bc) - zero : -zero;
    r.y = centred * scale + shift;
  } else {
    r.y = (x - reshape(astype(running_mean, x.dtype()), bc)) *
          rsqrt(reshape(astype(running_var, x.dtype()), bc) + opt.eps);
    if (gamma.valid()) r.y = r.y * reshape(astype(gamma, x.dtype()), bc);
    if (beta.valid()) r.y = r.y + reshape(astype(beta, x.dtype()), bc);
  }
  r.running_mean = running_mean;
  r.running_var = running_var;
  if (opt.training && running_mean.valid()) {
    const double m = opt.momentum;
    const Array batch_mean = astype(stop_gradient(reshape(mu, {c})), running_mean.dtype());
    const Array unbiased = astype(stop_gradient(reshape(var, {c})), running_var.dtype()) *
                           (static_cast<double>(n) / static_cast<double>(n - 1));
    r.running_mean = running_mean * (1 - m) + batch_mean * m;
    r.running_var = running_var * (1 - m) + unbiased * m;
  }
  return r;
}

Array group_norm(const Array& x, int64_t groups, const Array& gamma, const Array& beta,
                 double eps) {
  const char* op = "group_norm";
  if (!x.valid()) fail(op, "the input is an empty Array handle");
  if (x.ndim() < 2)
    fail(op, "input " + str(x.shape()) + ": expected rank 2 or more, [batch, channels, ...]");
  const int64_t c = x.shape()[1];
  if (groups < 1 || c % groups)
    fail(op,
         std::to_string(c) + " channels do not divide into " + std::to_string(groups) + " groups");
  require_channels(gamma, "weight", c, op);
  require_channels(beta, "bias", c, op);
  const Array g = reshape(x, {x.shape()[0], groups, -1});
  const Array centred = g - mean(g, {2}, true);
  Array y = reshape(centred * rsqrt(mean(centred * centred, {2}, true) + eps), x.shape());
  const Shape bc = channel_shape(x, 1);
  if (gamma.valid()) y = y * reshape(astype(gamma, x.dtype()), bc);
  if (beta.valid()) y = y + reshape(astype(beta, x.dtype()), bc);
  return y;
}

}  // namespace kiln
