"""The semantic classes of the datasets' semseg labels, by label value (a light module: the
datasets, the synthetic data generator and the partitions read it)."""

# PASCAL VOC's 21 classes, the PASCAL-Context semseg label; 0 is the background.
VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip

# NYU-40, spelled as released; a class's label is its index (the png stores label + 1). None is
# a background: the png's 0 is "unlabelled", read as 255 (ignored), as the public loader does.
NYU_CLASSES = (
    "wall", "floor", "cabinet", "bed", "chair", "sofa", "table", "door", "window", "bookshelf", "picture",
    "counter", "blinds", "desk", "shelves", "curtain", "dresser", "pillow", "mirror", "floor mat", "clothes",
    "ceiling", "books", "refridgerator", "television", "paper", "towel", "shower curtain", "box", "whiteboard",
    "person", "night stand", "toilet", "sink", "lamp", "bathtub", "bag", "otherstructure", "otherfurniture",
    "otherprop",
)  # fmt: skip

# Cityscapes' 19 evaluated classes by train id (cityscapesScripts helpers/labels.py); every
# other label id is read as 255 (ignored).
CITYSCAPES_CLASSES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign", "vegetation",
    "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle",
)  # fmt: skip
