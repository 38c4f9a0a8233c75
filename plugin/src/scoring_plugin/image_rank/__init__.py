"""Image ranking: a text query against candidate images (CLIP towers + a cross-attention adapter).

- :mod:`.settings`: the model's preprocessing and the deployment's limits (``scoring_image_rank``).
- :mod:`.types`: the IO processor's plain input and output.
- :mod:`.pixels`: bytes to the model's 8-bit pixels with Pillow (validation, bomb and size checks),
  and the normalisation the model applies to them on its device.
- :mod:`.device_pixels`: the same steps for JPEGs on a GPU (nvJPEG), opt-in (``decode_device``).
- :mod:`.fetch`: http(s) downloads under an address policy, with size and time caps.
- :mod:`.loader`: both of the above in bounded worker pools, one result or error per image.
"""
