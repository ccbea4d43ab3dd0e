"""Synthetic PASCAL-Context, NYUD-v2 and Cityscapes: rendered 3-D scenes in the real layouts.

    from fedmtl.synth import generate
    generate("pascal_context", "data/PASCALContext", num_train=500, num_val=200, size=(96, 96))
    generate("nyud", "data/NYUDv2")
    generate("cityscapes", "data/Cityscapes")  # 64 x 128 by default

or ``fedmtl data synth --dataset nyud --root data/NYUDv2``. The files go through
:mod:`fedmtl.data.layout`, so the dataset classes read them exactly as they read the real data;
the generator is a package of its own so that :mod:`fedmtl.data` is only the loaders.

Modules: :mod:`~fedmtl.synth.scenes` (what is in a scene), :mod:`~fedmtl.synth.render` (the
ray caster), :mod:`~fedmtl.synth.generator` (labels read off a rendering, the files written).

Every image is a ray-cast scene (:mod:`~fedmtl.synth.scenes`,
:mod:`~fedmtl.synth.render`) and every label is read off the same scene, so the tasks
agree with each other and with the image:

* semseg: the class of the object hit by each pixel's ray (VOC-21 / NYU-40);
* edges: boundaries between objects (NYUD: 2 px, one on each side; PASCAL: the loader takes
  the boundaries of the context ``LabelMap``, whose classes are per object: thinned Laplacian
  for train, BSDS ``seg2bmap`` for val);
* normals: of the surface hit, in camera coordinates: x right, y up, z toward the camera,
  unit length, n . ray < 0; the sky gets (0, 0, 1), which the loader masks out anyway;
* depth (NYUD): planar depth in metres, with Kinect-like holes (0) beside near objects and on glass;
* saliency (PASCAL): the nearest VOC objects and the largest one, 0/255;
* human parts (PASCAL): people are articulated figures whose shapes carry PASCAL-Part part
  names; about 40 % of the images have nobody in them, and so no human-parts label;
* Cityscapes: street scenes; gtFine labelIds hold the official label ids (not train ids),
  void ones too (ego vehicle, static, parking); the disparity png holds round(256 d) + 1 with
  d = fx * baseline / depth, Cityscapes' fx (2262.52 px at 2048 px) scaled to the image width
  and its 0.209313 m baseline, and 0 where a stereo matcher has none: the sky, beyond 150 m,
  the ego vehicle, pixels the right camera cannot see and a few texture-less blocks.

The same seed gives the same files byte for byte: image k of a split draws from its own
random stream, SeedSequence([seed, dataset, split, k]), whatever the number of workers.

Nothing is overwritten unless asked for: a folder that already holds files is refused (unless
``overwrite=True``), and the files are written to a hidden sibling folder that is renamed into
place only when complete, so a dataset folder is either absent or whole.
"""

from fedmtl.synth.generator import SYNTH, cityscapes_sample, generate, nyud_sample, pascal_sample, sample_rng

__all__ = ["SYNTH", "cityscapes_sample", "generate", "nyud_sample", "pascal_sample", "sample_rng"]
