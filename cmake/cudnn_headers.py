"""Prints where the pip wheels keep the cuDNN headers, one directory per line:
cudnn-frontend (nvidia-cudnn-frontend: <site-packages>/include) and cuDNN itself
(nvidia-cudnn-cu*: <site-packages>/nvidia/cudnn/include); an empty line for a missing one.
Nothing is imported, so this works in a build environment without a GPU."""
import importlib.util
import os


def _package_dir(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None


frontend = _package_dir("cudnn")
cudnn = _package_dir("nvidia.cudnn")
print(os.path.join(os.path.dirname(frontend), "include") if frontend else "")
print(os.path.join(cudnn, "include") if cudnn else "")
