// kiln's Python module: data sets and loaders (Python data sets included),
// the tokenizer, and the machine's threads (the training run: train.cpp).
#include "common.h"

namespace kiln_python {

// ---- data -------------------------------------------------------------------

// A data set written in Python: an object with __len__, image_shape and
// __getitem__(index) -> (image, label) (or get(index, epoch)). kiln's loader
// calls it from its worker threads, each call under the GIL.
class PyDataset final : public kiln::data::Dataset {
 public:
  explicit PyDataset(nb::object obj) : obj_(std::make_shared<PyFn>(std::move(obj))) {
    size_ = nb::cast<int64_t>(obj_->fn.attr("__len__")());
    shape_ = nb::cast<Shape>(obj_->fn.attr("image_shape"));
    with_epoch_ = nb::hasattr(obj_->fn, "get_epoch");
  }
  int64_t size() const override { return size_; }
  Shape image_shape() const override { return shape_; }
  void get(int64_t index, float* image, int32_t* label) const override {
    get(index, 0, image, label);
  }
  void get(int64_t index, int64_t epoch, float* image, int32_t* label) const override {
    nb::gil_scoped_acquire gil;
    nb::object item = with_epoch_ ? obj_->fn.attr("get_epoch")(index, epoch)
                                  : obj_->fn.attr("__getitem__")(index);
    auto pair = nb::cast<nb::tuple>(item);
    if (pair.size() != 2)
      kiln::fail("dataset", "item " + std::to_string(index) +
                                ": __getitem__ must return (image, label), got a tuple of " +
                                std::to_string(pair.size()));
    nb::object np = nb::module_::import_("numpy");
    auto x = nb::cast<nb::ndarray<const float, nb::c_contig, nb::device::cpu>>(
        np.attr("ascontiguousarray")(pair[0], "dtype"_a = np.attr("float32")));
    if (static_cast<int64_t>(x.size()) != kiln::numel(shape_))
      kiln::fail("dataset", "item " + std::to_string(index) + ": an image of " +
                                std::to_string(x.size()) + " values, expected image_shape " +
                                kiln::str(shape_));
    std::memcpy(image, x.data(), x.size() * sizeof(float));
    *label = nb::cast<int32_t>(pair[1]);
  }

 private:
  std::shared_ptr<PyFn> obj_;
  int64_t size_ = 0;
  Shape shape_;
  bool with_epoch_ = false;
};

// A loader whose destruction waits for its worker threads without the GIL
// (a worker may be waiting for it to call a Python data set).
struct PyLoader {
  std::shared_ptr<const kiln::data::Dataset> dataset;
  std::unique_ptr<kiln::data::Loader> loader;
  ~PyLoader() {
    nb::gil_scoped_release release;
    loader.reset();
  }
};

void bind_data(nb::module_& m) {
  // ---- data ----
  using kiln::data::Dataset;
  nb::class_<Dataset>(m, "_Dataset")
      .def("__len__", &Dataset::size)
      .def_prop_ro("image_shape", [](const Dataset& d) { return shape_tuple(d.image_shape()); })
      .def(
          "__getitem__",
          [](const Dataset& d, int64_t i) {
            if (i < 0) i += d.size();
            if (i < 0 || i >= d.size()) throw nb::index_error("data set index out of range");
            std::vector<float> image(kiln::numel(d.image_shape()));
            int32_t label = 0;
            {
              nb::gil_scoped_release release;
              d.get(i, image.data(), &label);
            }
            return nb::make_tuple(Array::from_data(image.data(), d.image_shape(), DType::f32),
                                  label);
          },
          "index"_a);
  m.def(
      "_random_images",
      [](int64_t n, int64_t labels, nb::handle size, int64_t channels, kiln::nn::Layout layout,
         uint64_t seed) {
        return std::shared_ptr<Dataset>(
            std::make_shared<kiln::data::RandomImages>(kiln::data::RandomImagesOptions{
                n, labels, to_size2d(size, "image_size"), channels, layout, seed}));
      },
      "num_samples"_a, "num_labels"_a, "image_size"_a, "channels"_a, "layout"_a, "seed"_a);
  m.def(
      "_fashion_mnist",
      [](const std::string& dir, const std::string& split, kiln::nn::Layout layout, bool hflip,
         uint64_t seed) {
        kiln::data::FashionMnistOptions o;
        o.dir = dir;
        o.split = split;
        o.layout = layout;
        o.hflip = hflip;
        o.seed = seed;
        nb::gil_scoped_release release;
        return std::shared_ptr<Dataset>(std::make_shared<kiln::data::FashionMnist>(o));
      },
      "dir"_a, "split"_a, "layout"_a, "hflip"_a, "seed"_a);
  m.def("_fashion_mnist_classes", &kiln::data::FashionMnist::class_names);
  m.def("_fashion_mnist_dir", [] { return std::string(kiln::data::kFashionMnistDir); });
  m.def(
      "_image_folder",
      [](const std::string& root, const std::string& split, nb::handle size, int64_t channels,
         bool augment, kiln::nn::Layout layout, uint64_t seed) {
        kiln::data::ImageFolderOptions o;
        o.root = root;
        o.split = split;
        o.image_size = to_size2d(size, "image_size");
        o.channels = channels;
        o.augment = augment;
        o.layout = layout;
        o.seed = seed;
        std::shared_ptr<kiln::data::ImageFolder> d;
        {
          nb::gil_scoped_release release;
          d = std::make_shared<kiln::data::ImageFolder>(o);
        }
        return nb::make_tuple(std::shared_ptr<Dataset>(d), d->classes());
      },
      "root"_a, "split"_a, "image_size"_a, "channels"_a, "augment"_a, "layout"_a, "seed"_a);
  m.def(
      "_python_dataset",
      [](nb::object obj) { return std::shared_ptr<Dataset>(std::make_shared<PyDataset>(obj)); },
      "dataset"_a);
  nb::class_<PyLoader>(m, "_Loader")
      .def(
          "__init__",
          [](PyLoader* l, std::shared_ptr<Dataset> dataset, int64_t batch_size, bool shuffle,
             uint64_t seed, bool drop_last, int workers, int prefetch, int64_t start,
             int64_t limit) {
            kiln::data::LoaderOptions o{batch_size, shuffle,  seed,  drop_last,
                                        workers,    prefetch, start, limit};
            new (l) PyLoader{dataset, std::make_unique<kiln::data::Loader>(dataset, o)};
          },
          "dataset"_a, "batch_size"_a, "shuffle"_a, "seed"_a, "drop_last"_a, "workers"_a,
          "prefetch"_a, "start"_a, "limit"_a)
      .def("next",
           [](PyLoader& l) {
             kiln::data::Batch b;
             try {
               nb::gil_scoped_release release;
               b = l.loader->next();
             } catch (const nb::python_error& e) {
               // The loader keeps its worker's error and raises it again on
               // every later call: each raise restores a copy of its own.
               throw nb::python_error(e);
             }
             return nb::make_tuple(b.images, b.labels, b.epoch, b.index);
           })
      .def_prop_ro("batches_per_epoch",
                   [](const PyLoader& l) { return l.loader->batches_per_epoch(); })
      .def_prop_ro("position", [](const PyLoader& l) { return l.loader->position(); })
      .def_prop_ro("wait_seconds", [](const PyLoader& l) { return l.loader->wait_seconds(); });

  // ---- the machine ----
  m.def("set_num_threads", &kiln::set_num_threads, "n"_a, kiln_doc("set_num_threads"));
  m.def("num_threads", &kiln::num_threads, kiln_doc("num_threads"));
  m.def("cpu_gemm_library", &kiln::cpu_gemm_library, kiln_doc("cpu_gemm_library"));
}

}  // namespace kiln_python
