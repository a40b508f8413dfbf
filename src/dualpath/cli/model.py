"""``dualpath model export``: write a project model as a Hugging Face folder (for vLLM and others)."""

from __future__ import annotations

import typer

from dualpath.cli._common import print_json, require_serve_extra

model_app = typer.Typer(help="Model files: export the default model for other engines.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""
    app.add_typer(model_app, name="model")


@model_app.command(name="export")
def export(
    model: str = typer.Argument(..., help="Model name (smollm2-135m), .gguf file or HF folder."),
    out_dir: str = typer.Argument(..., help="Folder to write (config.json, model.safetensors, tokenizer)."),
    overwrite: bool = typer.Option(False, help="Replace the files of a non-empty folder."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Write MODEL to OUT_DIR as fp32 safetensors + tokenizer, loadable by vLLM
    (``python -m vllm.entrypoints.openai.api_server --model OUT_DIR``)."""
    require_serve_extra("model export")

    from dualpath.integrations.vllm.export import export_hf_folder

    result = export_hf_folder(model, out_dir, overwrite=overwrite)
    if json_out:
        print_json(
            {
                "out_dir": result.out_dir,
                "model_type": result.model_type,
                "num_params": result.num_params,
                "files": list(result.files),
            }
        )
    else:
        typer.echo(
            f"wrote {result.out_dir}: {result.model_type}, {result.num_params:,} parameters, "
            f"files {', '.join(result.files)}"
        )
