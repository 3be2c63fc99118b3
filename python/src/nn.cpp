// kiln's Python module: the ViT, the layers of kiln/layers.h and the models
// of every family behind nn::Model.
#include "common.h"

namespace kiln_python {

nb::object size2d(const kiln::nn::Size2d& s) {
  if (s.square()) return nb::int_(s.height);
  return nb::make_tuple(s.height, s.width);
}
kiln::nn::Size2d to_size2d(nb::handle h, const char* what) {
  if (nb::isinstance<nb::int_>(h)) return kiln::nn::Size2d(nb::cast<int64_t>(h));
  auto v = nb::cast<std::vector<int64_t>>(h);
  if (v.size() != 2)
    kiln::fail(
        what, "an integer or a (height, width) pair, got " + std::to_string(v.size()) + " numbers");
  return {v[0], v[1]};
}

// One field of a ViTConfig set from Python (ViTConfig's keyword arguments).
void set_config_field(kiln::nn::ViTConfig& c, const std::string& k, nb::handle v) {
  if (k == "hidden_size")
    c.hidden_size = nb::cast<int64_t>(v);
  else if (k == "num_hidden_layers")
    c.num_hidden_layers = nb::cast<int64_t>(v);
  else if (k == "num_attention_heads")
    c.num_attention_heads = nb::cast<int64_t>(v);
  else if (k == "intermediate_size")
    c.intermediate_size = nb::cast<int64_t>(v);
  else if (k == "hidden_dropout_prob")
    c.hidden_dropout_prob = nb::cast<double>(v);
  else if (k == "attention_probs_dropout_prob")
    c.attention_probs_dropout_prob = nb::cast<double>(v);
  else if (k == "initializer_range")
    c.initializer_range = nb::cast<double>(v);
  else if (k == "layer_norm_eps")
    c.layer_norm_eps = nb::cast<double>(v);
  else if (k == "num_channels")
    c.num_channels = nb::cast<int64_t>(v);
  else if (k == "qkv_bias")
    c.qkv_bias = nb::cast<bool>(v);
  else if (k == "num_labels")
    c.num_labels = nb::cast<int64_t>(v);
  else if (k == "id2label")
    c.id2label = nb::cast<std::vector<std::string>>(v);
  else if (k == "image_size")
    c.image_size = to_size2d(v, "image_size");
  else if (k == "patch_size")
    c.patch_size = to_size2d(v, "patch_size");
  else if (k == "hidden_act") {
    auto a = kiln::nn::activation_from_name(nb::cast<std::string>(v));
    if (!a)
      kiln::fail("ViTConfig", "hidden_act '" + nb::cast<std::string>(v) +
                                  "' is not an activation transformers knows");
    c.hidden_act = *a;
  } else {
    throw nb::type_error(("ViTConfig has no field '" + k + "'").c_str());
  }
}

void bind_nn_io(nb::module_& m) {
  // ---- nn ----
  using kiln::nn::ViTConfig;
  nb::enum_<kiln::nn::Layout>(m, "Layout")
      .value("NCHW", kiln::nn::Layout::NCHW)
      .value("NHWC", kiln::nn::Layout::NHWC);
  nb::class_<ViTConfig>(m, "ViTConfig",
                        "transformers' ViTConfig, field for field: ViTConfig() is "
                        "transformers' default (ViT-Base/16), ViTConfig(\"vit-tiny\") a preset "
                        "(vit-tiny, vit-small, vit-base, vit-large, vit-fmnist); keyword "
                        "arguments set fields.")
      .def(
          "__init__",
          [](ViTConfig* c, std::optional<std::string> preset, nb::kwargs fields) {
            ViTConfig v = preset ? ViTConfig::preset(*preset) : ViTConfig();
            for (auto [k, val] : fields) set_config_field(v, nb::cast<std::string>(k), val);
            new (c) ViTConfig(std::move(v));
          },
          "preset"_a = nb::none(), "fields"_a)
      .def_static("preset", &ViTConfig::preset, "name"_a)
      .def_static("preset_names", &ViTConfig::preset_names)
      .def_rw("hidden_size", &ViTConfig::hidden_size)
      .def_rw("num_hidden_layers", &ViTConfig::num_hidden_layers)
      .def_rw("num_attention_heads", &ViTConfig::num_attention_heads)
      .def_rw("intermediate_size", &ViTConfig::intermediate_size)
      .def_rw("hidden_dropout_prob", &ViTConfig::hidden_dropout_prob)
      .def_rw("attention_probs_dropout_prob", &ViTConfig::attention_probs_dropout_prob)
      .def_rw("initializer_range", &ViTConfig::initializer_range)
      .def_rw("layer_norm_eps", &ViTConfig::layer_norm_eps)
      .def_rw("num_channels", &ViTConfig::num_channels)
      .def_rw("qkv_bias", &ViTConfig::qkv_bias)
      .def_rw("num_labels", &ViTConfig::num_labels)
      .def_rw("id2label", &ViTConfig::id2label)
      .def_prop_rw(
          "hidden_act", [](const ViTConfig& c) { return kiln::nn::activation_name(c.hidden_act); },
          [](ViTConfig& c, nb::handle v) { set_config_field(c, "hidden_act", v); })
      .def_prop_rw(
          "image_size", [](const ViTConfig& c) { return size2d(c.image_size); },
          [](ViTConfig& c, nb::handle v) { set_config_field(c, "image_size", v); })
      .def_prop_rw(
          "patch_size", [](const ViTConfig& c) { return size2d(c.patch_size); },
          [](ViTConfig& c, nb::handle v) { set_config_field(c, "patch_size", v); })
      .def_prop_ro("num_patches", &ViTConfig::num_patches)
      .def("validate", [](const ViTConfig& c) { c.validate(); })
      .def("train_flops_per_image", [](const ViTConfig& c) { return c.train_flops_per_image(); })
      .def(
          "to_json_file",
          [](const ViTConfig& c, const std::string& path) { kiln::io::save_config(path, c); },
          "path"_a)
      .def_static(
          "from_json_file",
          [](const std::string& path) { return kiln::io::load_config<ViTConfig>(path); }, "path"_a)
      .def("__copy__", [](const ViTConfig& c) { return ViTConfig(c); })
      .def(
          "__deepcopy__", [](const ViTConfig& c, nb::handle) { return ViTConfig(c); }, "memo"_a)
      .def("__repr__", [](const ViTConfig& c) {
        return "ViTConfig(hidden_size=" + std::to_string(c.hidden_size) +
               ", num_hidden_layers=" + std::to_string(c.num_hidden_layers) +
               ", num_attention_heads=" + std::to_string(c.num_attention_heads) +
               ", intermediate_size=" + std::to_string(c.intermediate_size) +
               ", image_size=" + kiln::nn::to_string(c.image_size) +
               ", patch_size=" + kiln::nn::to_string(c.patch_size) +
               ", num_channels=" + std::to_string(c.num_channels) +
               ", num_labels=" + std::to_string(c.num_labels) + ")";
      });

  using kiln::nn::ViTForImageClassification;
  nb::class_<ViTForImageClassification>(m, "_ViT")
      .def(nb::init<ViTConfig>(), "config"_a)
      .def_prop_ro("config", &ViTForImageClassification::config)
      .def("init", &ViTForImageClassification::init, "key"_a, "device"_a = Device::cpu(), NoGil())
      .def("parameter_shapes", &ViTForImageClassification::parameter_shapes)
      .def("check", &ViTForImageClassification::check, "params"_a, "origin"_a)
      .def(
          "apply",
          [](const ViTForImageClassification& vit, const kiln::Params& params, const Array& pixels,
             kiln::nn::Layout layout, bool train, std::optional<kiln::random::Key> key,
             std::optional<Array> key_array, DType matmul_dtype, bool fused_attention,
             bool inference) {
            kiln::nn::ApplyOptions o;
            o.layout = layout;
            o.train = train;
            if (key) o.dropout_key = *key;
            if (key_array) o.dropout_key_array = *key_array;
            o.matmul_dtype = matmul_dtype;
            o.fused_attention = fused_attention;
            o.inference = inference;
            return vit.apply(params, pixels, o);
          },
          "params"_a, "pixels"_a, "layout"_a, "train"_a, "dropout_key"_a.none(),
          "dropout_key_array"_a.none(), "matmul_dtype"_a, "fused_attention"_a,
          "inference"_a = false, NoGil())
      .def("loss", &ViTForImageClassification::loss, "logits"_a, "labels"_a,
           "label_smoothing"_a = 0.0, NoGil());
  m.def("_key_array", &kiln::random::key_array, "key"_a, "device"_a = Device::cpu());
}

// ---- layers (kiln/layers.h) -------------------------------------------------

// What each layer binding shares: its declarations, init, and a forward
// through a Scope of the options Python gives; `call` runs the layer.
template <typename L, typename Call>
void layer_methods(nb::class_<L>& c, Call call) {
  namespace nn = kiln::nn;
  c.def("declarations",
        [](const L& l) {
          nn::Decls d;
          l.declare(d);
          return nn::shapes_of(d);
        })
      .def(
          "init",
          [](const L& l, const kiln::random::Key& key, Device device) {
            nn::Decls d;
            l.declare(d);
            return nn::init_params(d, key, device);
          },
          "key"_a, "device"_a = Device::cpu(), NoGil())
      .def(
          "apply",
          [call](const L& l, const kiln::Params& params, const kiln::Params& state, const Array& x,
                 kiln::nn::Layout in, kiln::nn::Layout out, bool train, bool drop,
                 std::optional<Array> key, DType matmul_dtype, bool fused, bool inference) {
            nn::ModelOptions o{.layout = in,
                               .train = train,
                               .drop = drop,
                               .matmul_dtype = matmul_dtype,
                               .fused_attention = fused,
                               .inference = inference};
            if (key) o.key = *key;
            nn::Scope s(params, state, std::move(o), "nn");
            Array y = call(l, s, x, in, out);
            return std::pair{y, s.take_state()};
          },
          "params"_a, "state"_a, "x"_a, "layout"_a, "out_layout"_a, "train"_a, "drop"_a,
          "key"_a.none(), "matmul_dtype"_a, "fused_attention"_a, "inference"_a, NoGil());
}

void bind_layers(nb::module_& m) {
  namespace nn = kiln::nn;
  using nn::Layout;
  using nn::Scope;
  nb::class_<nn::Init>(m, "_Init")
      .def_static("zeros", &nn::Init::zeros)
      .def_static("ones", &nn::Init::ones)
      .def_static("constant", &nn::Init::constant, "value"_a)
      .def_static("normal", &nn::Init::normal, "std"_a)
      .def_static("truncated_normal", &nn::Init::truncated_normal, "std"_a)
      .def_static("uniform", &nn::Init::uniform, "bound"_a)
      .def_static("kaiming_normal_fan_out", &nn::Init::kaiming_normal_fan_out, "fan_out"_a)
      .def_static("torch_default", &nn::Init::torch_default, "fan_in"_a);

  nb::class_<nn::Linear> linear(m, "_Linear");
  linear.def(nb::init<>())
      .def_rw("name", &nn::Linear::name)
      .def_rw("in_features", &nn::Linear::in)
      .def_rw("out_features", &nn::Linear::out)
      .def_rw("bias", &nn::Linear::bias)
      .def_rw("weight_init", &nn::Linear::weight_init)
      .def_rw("bias_init", &nn::Linear::bias_init);
  layer_methods(linear, [](const nn::Linear& l, Scope& s, const Array& x, Layout, Layout) {
    return l(s, x);
  });

  auto size_prop = [](auto& cls, const char* name, nn::Size2d nn::Conv2d::*field) {
    cls.def_prop_rw(
        name, [field](const nn::Conv2d& c) { return size2d(c.*field); },
        [field, name](nn::Conv2d& c, nb::handle v) { c.*field = to_size2d(v, name); });
  };
  nb::class_<nn::Conv2d> conv(m, "_Conv2d");
  conv.def(nb::init<>())
      .def_rw("name", &nn::Conv2d::name)
      .def_rw("in_channels", &nn::Conv2d::in)
      .def_rw("out_channels", &nn::Conv2d::out)
      .def_rw("padding", &nn::Conv2d::padding)
      .def_rw("same", &nn::Conv2d::same)
      .def_rw("groups", &nn::Conv2d::groups)
      .def_rw("bias", &nn::Conv2d::bias)
      .def_rw("weight_init", &nn::Conv2d::weight_init)
      .def_rw("bias_init", &nn::Conv2d::bias_init)
      .def_rw("patch_matmul", &nn::Conv2d::patch_matmul);
  size_prop(conv, "kernel_size", &nn::Conv2d::kernel);
  size_prop(conv, "stride", &nn::Conv2d::stride);
  size_prop(conv, "dilation", &nn::Conv2d::dilation);
  layer_methods(conv, [](const nn::Conv2d& c, Scope& s, const Array& x, Layout in, Layout out) {
    return c(s, x, in, out);
  });

  nb::class_<nn::LayerNorm> ln(m, "_LayerNorm");
  ln.def(nb::init<>())
      .def_rw("name", &nn::LayerNorm::name)
      .def_rw("dim", &nn::LayerNorm::dim)
      .def_rw("eps", &nn::LayerNorm::eps)
      .def_rw("channels_first", &nn::LayerNorm::channels_first);
  layer_methods(
      ln, [](const nn::LayerNorm& l, Scope& s, const Array& x, Layout, Layout) { return l(s, x); });

  nb::class_<nn::BatchNorm> bn(m, "_BatchNorm");
  bn.def(nb::init<>())
      .def_rw("name", &nn::BatchNorm::name)
      .def_rw("dim", &nn::BatchNorm::dim)
      .def_rw("eps", &nn::BatchNorm::eps)
      .def_rw("momentum", &nn::BatchNorm::momentum)
      .def(
          "init_state",
          [](const nn::BatchNorm& b, Device device) {
            nn::Decls d;
            b.declare_state(d);
            return nn::init_state(d, device);
          },
          "device"_a = Device::cpu());
  layer_methods(bn, [](const nn::BatchNorm& b, Scope& s, const Array& x, Layout in, Layout) {
    return b(s, x, in);
  });

  nb::class_<nn::Embedding> emb(m, "_Embedding");
  emb.def(nb::init<>())
      .def_rw("name", &nn::Embedding::name)
      .def_rw("num_embeddings", &nn::Embedding::num)
      .def_rw("dim", &nn::Embedding::dim)
      .def_rw("init_", &nn::Embedding::init);
  layer_methods(emb, [](const nn::Embedding& e, Scope& s, const Array& x, Layout, Layout) {
    return e(s, x);
  });

  // Dropout and DropPath declare nothing; they take `declare` for the shared methods.
  struct DropoutLayer : nn::Dropout {
    void declare(nn::Decls&) const {}
  };
  struct DropPathLayer : nn::DropPath {
    void declare(nn::Decls&) const {}
  };
  nb::class_<DropoutLayer> dropout(m, "_Dropout");
  dropout.def(nb::init<>())
      .def_prop_rw(
          "p", [](const DropoutLayer& d) { return d.p; },
          [](DropoutLayer& d, double p) { d.p = p; });
  layer_methods(dropout, [](const DropoutLayer& d, Scope& s, const Array& x, Layout, Layout) {
    return d(s, x);
  });
  nb::class_<DropPathLayer> drop_path(m, "_DropPath");
  drop_path.def(nb::init<>())
      .def_prop_rw(
          "p", [](const DropPathLayer& d) { return d.p; },
          [](DropPathLayer& d, double p) { d.p = p; });
  layer_methods(drop_path, [](const DropPathLayer& d, Scope& s, const Array& x, Layout, Layout) {
    return d(s, x);
  });

  nb::class_<nn::MultiHeadAttention> mha(m, "_MultiHeadAttention");
  mha.def(nb::init<>())
      .def_rw("query", &nn::MultiHeadAttention::query)
      .def_rw("key", &nn::MultiHeadAttention::key)
      .def_rw("value", &nn::MultiHeadAttention::value)
      .def_rw("output", &nn::MultiHeadAttention::output)
      .def_rw("dim", &nn::MultiHeadAttention::dim)
      .def_rw("heads", &nn::MultiHeadAttention::heads)
      .def_rw("head_dim", &nn::MultiHeadAttention::head_dim)
      .def_rw("qkv_bias", &nn::MultiHeadAttention::qkv_bias)
      .def_rw("dropout", &nn::MultiHeadAttention::dropout)
      .def_rw("weight_init", &nn::MultiHeadAttention::weight_init);
  layer_methods(mha, [](const nn::MultiHeadAttention& a, Scope& s, const Array& x, Layout, Layout) {
    return a(s, x);
  });

  nb::class_<nn::MLP> mlp(m, "_MLP");
  mlp.def(nb::init<>())
      .def_rw("up", &nn::MLP::up)
      .def_rw("down", &nn::MLP::down)
      .def_prop_rw(
          "activation", [](const nn::MLP& p) { return std::string(nn::activation_name(p.act)); },
          [](nn::MLP& p, const std::string& name) {
            auto a = nn::activation_from_name(name);
            if (!a) {
              std::string known;
              for (const auto& n : nn::activation_names()) known += (known.empty() ? "" : ", ") + n;
              kiln::fail("nn.MLP", "unknown activation '" + name + "', expected one of " + known);
            }
            p.act = *a;
          });
  layer_methods(mlp,
                [](const nn::MLP& p, Scope& s, const Array& x, Layout, Layout) { return p(s, x); });
}

void bind_models(nb::module_& m) {
  using kiln::nn::Model;
  using Ptr = std::shared_ptr<Model>;
  // The registry's models are const; Python holds them as they are.
  auto held = [](std::shared_ptr<const Model> p) { return std::const_pointer_cast<Model>(p); };
  nb::class_<Model>(m, "_Model")
      .def_prop_ro("model_type", &Model::model_type)
      .def_prop_ro("architecture", &Model::architecture)
      .def_prop_ro("causal_lm", &Model::causal_lm)
      .def_prop_ro("num_logits", &Model::num_logits)
      .def_prop_ro("num_labels", &Model::num_labels)
      .def_prop_ro("num_channels", &Model::num_channels)
      .def_prop_ro("image_size", [](const Model& md) { return size2d(md.image_size()); })
      .def("label_names", &Model::label_names)
      .def("parameter_shapes", &Model::parameter_shapes)
      .def("state_shapes", &Model::state_shapes)
      .def("head_parameters", &Model::head_parameters)
      .def("config_json", &Model::config_json)
      .def(
          "layer_decay_scales",
          [](const Model& md, double decay) { return kiln::nn::layer_decay_scales(md, decay); },
          "decay"_a)
      .def("init", &Model::init, "key"_a, "device"_a = Device::cpu(), NoGil())
      .def("init_state", &Model::init_state, "device"_a = Device::cpu(), NoGil())
      .def("check", &Model::check, "params"_a, "state"_a, "origin"_a)
      .def(
          "apply",
          [](const Model& md, const kiln::Params& params, const kiln::Params& state,
             const Array& pixels, kiln::nn::Layout layout, bool train, std::optional<Array> key,
             DType matmul_dtype, bool inference) {
            kiln::nn::ModelOptions o{.layout = layout,
                                     .train = train,
                                     .matmul_dtype = matmul_dtype,
                                     .inference = inference};
            if (key) o.key = *key;
            kiln::nn::ModelOutput out = md.apply(params, state, pixels, o);
            return std::pair{out.logits, out.state};
          },
          "params"_a, "state"_a, "pixels"_a, "layout"_a, "train"_a, "key"_a.none(),
          "matmul_dtype"_a, "inference"_a = false, NoGil())
      .def("loss", &Model::loss, "logits"_a, "labels"_a, "label_smoothing"_a = 0.0, NoGil())
      .def(
          "with_labels",
          [held](const Model& md, const std::vector<std::string>& names) {
            return held(md.with_labels(names));
          },
          "names"_a)
      .def("train_flops_per_example", [](const Model& md, nb::handle size) {
        return md.train_flops_per_example(to_size2d(size, "image_size"));
      });
  m.def(
      "_model_from_config",
      [held](const std::string& text, const std::string& origin) -> Ptr {
        return held(kiln::nn::model_from_config(text, origin));
      },
      "text"_a, "origin"_a);
  m.def(
      "_model_from_preset",
      [held](const std::string& name) -> Ptr { return held(kiln::nn::model_from_preset(name)); },
      "name"_a);
  m.def(
      "_generate",
      [](const Model& md, const kiln::Params& params, const Array& prompt, int64_t max_new_tokens,
         double temperature, int64_t top_k, double top_p, uint64_t seed, int64_t eos_token_id,
         int64_t pad_token_id, DType matmul_dtype, bool compiled) {
        const kiln::nn::GPT2LMHeadModel* lm = kiln::nn::as_gpt2(md);
        if (!lm)
          kiln::fail("generate", md.architecture() +
                                     " is not a language model (generate takes GPT2LMHeadModel)");
        return kiln::nn::generate(*lm, params, prompt,
                                  {.max_new_tokens = max_new_tokens,
                                   .temperature = temperature,
                                   .top_k = top_k,
                                   .top_p = top_p,
                                   .seed = seed,
                                   .eos_token_id = eos_token_id,
                                   .pad_token_id = pad_token_id,
                                   .matmul_dtype = matmul_dtype,
                                   .compiled = compiled});
      },
      "model"_a, "params"_a, "prompt"_a, "max_new_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a,
      "seed"_a, "eos_token_id"_a, "pad_token_id"_a, "matmul_dtype"_a, "compiled"_a, NoGil());
  m.def(
      "_inference_params",
      [](const Model& md, const kiln::Params& params, DType matmul_dtype) {
        const kiln::nn::GPT2LMHeadModel* lm = kiln::nn::as_gpt2(md);
        if (!lm)
          kiln::fail("inference_params",
                     md.architecture() + " is not a language model (it takes GPT2LMHeadModel)");
        return lm->inference_params(params, matmul_dtype);
      },
      "model"_a, "params"_a, "matmul_dtype"_a, NoGil());
  using kiln::data::Tokenizer;
  nb::class_<Tokenizer>(m, "_Tokenizer")
      .def_static("from_folder", &Tokenizer::from_folder, "dir"_a, NoGil())
      .def_static("from_json_file", &Tokenizer::from_json_file, "path"_a, NoGil())
      .def_static("from_vocab_and_merges", &Tokenizer::from_vocab_and_merges, "vocab"_a, "merges"_a,
                  "special"_a, NoGil())
      .def(
          "encode", [](const Tokenizer& t, const std::string& text) { return t.encode(text); },
          "text"_a, NoGil())
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<int32_t>& ids) {
            // Bytes of a token cut mid-character stay as they are: bytes, not str.
            const std::string s = t.decode(ids);
            return nb::bytes(s.data(), s.size());
          },
          "ids"_a)
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def(
          "token_id",
          [](const Tokenizer& t, const std::string& token) { return t.token_id(token); }, "token"_a)
      .def_prop_ro("origin", &Tokenizer::origin);
  m.def("_model_folder", &kiln::io::resolve_model_source, "src"_a, NoGil());
  m.def("_model_types", &kiln::nn::model_types);
  m.def("_model_presets", &kiln::nn::model_presets);
  m.def(
      "_load_model",
      [held](const std::string& src, std::optional<std::vector<std::string>> labels,
             const kiln::random::Key& key) {
        kiln::io::Pretrained p;
        {
          nb::gil_scoped_release release;
          p = kiln::io::load_pretrained(src);
          if (labels) kiln::io::adapt_classifier(p, *labels, key);
        }
        return nb::make_tuple(held(p.model), p.params, p.state, p.has_classifier, p.notes, p.dir);
      },
      "src"_a, "labels"_a.none(), "key"_a);
  m.def(
      "_save_model",
      [](const std::string& dir, const Model& md, const kiln::Params& params,
         const kiln::Params& state) { kiln::io::save_pretrained(dir, md, params, state); },
      "dir"_a, "model"_a, "params"_a, "state"_a, NoGil());
}

}  // namespace kiln_python
