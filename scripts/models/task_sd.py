"""Stable Diffusion 1.5's three networks with random weights in SD 1.5's configuration
(runwayml/stable-diffusion-v1-5's config.json files, written out here), exported as diffusers'
converter (scripts/convert_stable_diffusion_checkpoint_to_onnx.py) and optimum's exporter make
them: TorchScript at opset 14 (their default; CLIP's causal mask needs Trilu), float32,
do_constant_folding, their input and output names and dynamic axes, the UNet's weights (3.4 GB)
as external data in one file beside the model.

  sd15_unet          sample [2N, 4, 64, 64], timestep [1] int64, encoder_hidden_states
                     [2N, 77, 768] -> out_sample: one denoising step of N images with
                     classifier-free guidance (the batch holds each image twice)
  sd15_vae_decoder   latent_sample [N, 4, 64, 64] -> sample [N, 3, 512, 512] (vae.decode)
  sd15_text_encoder  input_ids [N, 77] int32 -> last_hidden_state [N, 77, 768], pooler_output
                     (transformers' CLIPTextModel, 12 layers, hidden 768)
The _tiny versions (tests/models/tasks) have the same block types with a few channels.
"""
UNET = dict(sample_size=64, in_channels=4, out_channels=4, center_input_sample=False, flip_sin_to_cos=True,
            freq_shift=0, down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                            "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
            block_out_channels=(320, 640, 1280, 1280), layers_per_block=2, downsample_padding=1,
            mid_block_scale_factor=1, act_fn="silu", norm_num_groups=32, norm_eps=1e-5,
            cross_attention_dim=768, attention_head_dim=8)
UNET_TINY = dict(UNET, sample_size=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=(8, 16),
                 layers_per_block=1, norm_num_groups=4, cross_attention_dim=8, attention_head_dim=2)
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
           up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
           layers_per_block=2, act_fn="silu", latent_channels=4, norm_num_groups=32, sample_size=512)
VAE_TINY = dict(VAE, down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, sample_size=16)
CLIP = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768, num_hidden_layers=12,
            num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
            pad_token_id=1, bos_token_id=0, eos_token_id=2)
CLIP_TINY = dict(CLIP, vocab_size=1000, hidden_size=32, intermediate_size=64, projection_dim=32,
                 num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16)


def _unet(name, cfg, seq, note, Task):
    import torch
    from diffusers import UNet2DConditionModel
    m = UNet2DConditionModel(**cfg).eval()

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unet = m

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]

    side, ctx = cfg["sample_size"], cfg["cross_attention_dim"]
    inputs = {"sample": {"recipe": "normal", "shape": ["2N", 4, side, side]},
              "timestep": {"recipe": "const", "value": [981], "dtype": "int64"},
              "encoder_hidden_states": {"recipe": "normal", "shape": ["2N", seq, ctx], "seed": 100}}
    dyn = {"sample": {0: "batch_size", 2: "height", 3: "width"},
           "encoder_hidden_states": {0: "batch_size", 1: "sequence_length"},
           "out_sample": {0: "batch_size", 2: "height", 3: "width"}}
    return Task(name, Step().eval(), inputs, ["out_sample"], dyn, opset=14, note=note,
                external_data=name == "sd15_unet")


def _vae(name, cfg, Task):
    import torch
    from diffusers import AutoencoderKL
    vae = AutoencoderKL(**cfg).eval()

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vae = vae

        def forward(self, latent_sample):
            return self.vae.decode(latent_sample, return_dict=False)[0]

    side = cfg["sample_size"] // 2 ** (len(cfg["block_out_channels"]) - 1)
    inputs = {"latent_sample": {"recipe": "normal", "shape": ["N", 4, side, side]}}
    dyn = {"latent_sample": {0: "batch_size", 2: "height_latent", 3: "width_latent"},
           "sample": {0: "batch_size", 2: "height", 3: "width"}}
    return Task(name, Decode().eval(), inputs, ["sample"], dyn, opset=14,
                note=f"latent_sample [N, 4, {side}, {side}] -> sample [N, 3, {cfg['sample_size']}, {cfg['sample_size']}]")


def _clip(name, cfg, Task):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel
    m = CLIPTextModel(CLIPTextConfig(**cfg)).eval()

    class Encode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            o = self.m(input_ids=input_ids, return_dict=False)
            return o[0], o[1]

    seq, vocab = cfg["max_position_embeddings"], cfg["vocab_size"]
    inputs = {"input_ids": {"recipe": "clip_ids", "shape": ["N", seq], "vocab": vocab}}
    dyn = {"input_ids": {0: "batch_size", 1: "sequence_length"},
           "last_hidden_state": {0: "batch_size", 1: "sequence_length"}, "pooler_output": {0: "batch_size"}}
    return Task(name, Encode().eval(), inputs, ["last_hidden_state", "pooler_output"], dyn, opset=14,
                note=f"input_ids [N, {seq}] int32 (as optimum exports CLIP's text encoder)")


def build(name, Task, seed):
    seed(0)
    if name == "sd15_unet":
        return _unet(name, UNET, 77, "sample [2N, 4, 64, 64] (N images, classifier-free guidance), timestep [1], "
                     "encoder_hidden_states [2N, 77, 768]; external data", Task)
    if name == "sd15_unet_tiny":
        return _unet(name, UNET_TINY, 8, "SD 1.5's UNet blocks at 8/16 channels, sample [2N, 4, 8, 8]", Task)
    if name == "sd15_vae_decoder":
        return _vae(name, VAE, Task)
    if name == "sd15_vae_decoder_tiny":
        return _vae(name, VAE_TINY, Task)
    if name == "sd15_text_encoder":
        return _clip(name, CLIP, Task)
    if name == "sd15_text_encoder_tiny":
        return _clip(name, CLIP_TINY, Task)
    raise KeyError(name)
