"""Analysis stages of the inference path: ROI proposals, segmentation, recheck, lesions."""
