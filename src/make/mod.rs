//! Archives made here: random well-conditioned ones and float checkpoints
//! ([`synth`]), and float checkpoints quantized into archives ([`pack`]).

pub mod pack;
pub mod synth;
