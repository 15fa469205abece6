//! `--workload sglang`: instances that behave toward sglang's head
//! (`DiffusionServer`, sglang 0.5.23) as its own role instances do, with
//! deterministic tensors in place of a model.
//!
//! - The encoder takes the work items the head dispatches
//!   (`[request_id, pickled Req list]`) and stages, under the head's
//!   request id, the pipeline's encoder tensors with contents derived from
//!   that id.
//! - A denoiser checks every byte it receives and forwards the denoised
//!   latents in one `transfer_done{staged_for_decoder}`.
//! - The decoder checks every byte and returns an `output` tensor to the
//!   head as sglang's tensor multipart (a JSON descriptor frame, then the
//!   tensor's bytes), which the head hands to its client.
//!
//! The output is `OUTPUT_SHAPE` bytes of `uint8` filled as tensor
//! [`OUTPUT_TENSOR`] of request [`request_number`]`(id)` (see `data.rs`), so
//! a client can check it without ferry.

use std::time::Duration;

use serde_json::json;
use tensorferry::runtime::{Delivery, InstanceNode};

use super::data;
use super::roles::{emit_json, forward_denoised, stage_with_patience};
use super::stopping::Ending;

/// The decoder's output: a 64×64 RGB image of `uint8`.
pub const OUTPUT_SHAPE: [u64; 3] = [64, 64, 3];

/// The tensor number the decoder's output is filled as.
pub const OUTPUT_TENSOR: u64 = 7;

/// The request number the tensors of request `id` are derived from:
/// FNV-1a (64-bit) of the id's UTF-8 bytes.
pub fn request_number(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Counts one sglang-workload instance reports.
#[derive(Debug, Default)]
pub struct SglangTally {
    /// Work items taken (encoder).
    pub work_items: u64,
    /// Requests staged (encoder) or forwarded (denoiser).
    pub staged: u64,
    /// Transfers received (denoiser, decoder).
    pub received: u64,
    /// Received transfers whose every byte was as made.
    pub verified: u64,
    /// Received transfers with a byte that was not.
    pub mismatches: u64,
    /// Outputs returned to the head (decoder).
    pub outputs: u64,
    /// Calls that failed (staging, forwarding, sending).
    pub errors: u64,
}

impl SglangTally {
    /// Counts a call's `result`: one more in the counter `done` picks if
    /// it went through, else one more error, announced as `event` for the
    /// request `id`.
    fn count<E: std::fmt::Display>(
        &mut self,
        result: Result<(), E>,
        done: fn(&mut Self) -> &mut u64,
        event: &str,
        id: &str,
    ) {
        match result {
            Ok(()) => *done(self) += 1,
            Err(e) => {
                self.errors += 1;
                emit_json(&json!({"event": event, "id": id, "error": e.to_string()}));
            }
        }
    }
}

/// The roles of the sglang workload (sglang's names; `denoising` is its
/// alias of `denoiser`, `prompt_encoder` the text encoder of a split
/// encoder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglangRole {
    /// Takes work items and stages their tensors.
    Encoder,
    /// Checks and forwards.
    Denoiser,
    /// Checks and returns the output.
    Decoder,
}

impl SglangRole {
    /// The role named `name`, as sglang's `RoleType.from_string` reads it.
    pub fn from_name(name: &str) -> Result<Self, String> {
        match name.to_ascii_lowercase().as_str() {
            "encoder" | "prompt_encoder" => Ok(Self::Encoder),
            "denoiser" | "denoising" => Ok(Self::Denoiser),
            "decoder" => Ok(Self::Decoder),
            "image_encoder" => Err("the sglang workload has no image encoder".to_owned()),
            other => Err(format!(
                "{other:?} is not a role of the sglang workload (encoder, prompt_encoder, denoiser, denoising, decoder)"
            )),
        }
    }
}

/// Runs `role` of the sglang workload until `ending` says to stop.
pub(crate) fn run(
    node: &InstanceNode,
    role: SglangRole,
    ending: &mut Ending<'_>,
    tally: &mut SglangTally,
) {
    match role {
        SglangRole::Encoder => encode(node, ending, tally),
        SglangRole::Denoiser => receive(node, ending, tally, forward),
        SglangRole::Decoder => receive(node, ending, tally, output),
    }
}

fn encode(node: &InstanceNode, ending: &mut Ending<'_>, tally: &mut SglangTally) {
    let specs = data::encoder_tensors();
    while ending.keep_going() {
        let Some(item) = node.next_frame(Duration::from_millis(20)) else {
            continue;
        };
        let Some(id) = item.request_id().map(str::to_owned) else {
            tally.errors += 1;
            emit_json(&json!({"event": "bad_work_item", "why": "frame 0 is not a request id"}));
            continue;
        };
        tally.work_items += 1;
        let n = request_number(&id);
        // The head sends no more than its encoder capacity; room frees as
        // the denoisers take what is staged.
        let staged = stage_with_patience(node, &id, &specs, Duration::from_secs(30), || {
            std::thread::sleep(Duration::from_millis(1));
            ending.patient()
        })
        .and_then(|mut s| {
            for k in 0..specs.len() {
                if let Some(t) = s.tensor_mut(k) {
                    data::fill(t, n, k as u64);
                }
            }
            s.commit(&json!({"request_id": id}).to_string())
        });
        // A request not staged: the head fails it at its timeout.
        tally.count(staged, |t| &mut t.staged, "stage_failed", &id);
    }
}

/// A delivery whose every byte was as the previous role made it, as
/// [`receive`] hands it on.
struct Checked<'a, 'n> {
    node: &'n InstanceNode,
    delivery: Delivery<'n>,
    /// The request's number, which its bytes were made from.
    n: u64,
    /// False once the process stops waiting.
    patient: &'a dyn Fn() -> bool,
}

/// Receives, checks every byte against what the previous role made from
/// the request id, and hands good deliveries to `then`.
fn receive(
    node: &InstanceNode,
    ending: &mut Ending<'_>,
    tally: &mut SglangTally,
    then: impl Fn(Checked<'_, '_>, &mut SglangTally),
) {
    while ending.keep_going() {
        let Some(d) = node.recv(Duration::from_millis(20)) else {
            continue;
        };
        tally.received += 1;
        let n = request_number(d.id());
        let mut bad = None;
        let mut seen = 0;
        for v in d.tensors() {
            seen += 1;
            let at = match v.field.raw() {
                "prompt_embeds" => data::check(v.bytes, n, 0),
                "latents" if seen == 1 && d.manifest().iter().count() == 1 => {
                    data::check_denoised(v.bytes, n)
                }
                "latents" => data::check(v.bytes, n, 1),
                _ => Some(0),
            };
            if let Some(at) = at {
                bad = Some((v.field.raw().to_owned(), at));
            }
        }
        if seen == 0 {
            bad = Some(("manifest".to_owned(), 0));
        }
        if let Some((field, at)) = bad {
            tally.mismatches += 1;
            emit_json(&json!({"event": "mismatch", "id": d.id(), "field": field, "byte": at}));
            d.fail("byte mismatch");
            continue;
        }
        tally.verified += 1;
        let checked = Checked {
            node,
            delivery: d,
            n,
            patient: &|| ending.patient(),
        };
        then(checked, tally);
    }
}

fn forward(c: Checked<'_, '_>, tally: &mut SglangTally) {
    let id = c.delivery.id().to_owned();
    let scalars = json!({"request_id": id}).to_string();
    let forwarded = forward_denoised(c.node, c.delivery, c.n, &scalars, c.patient);
    tally.count(forwarded, |t| &mut t.staged, "forward_failed", &id);
}

fn output(c: Checked<'_, '_>, tally: &mut SglangTally) {
    let Checked {
        node,
        delivery: d,
        n,
        ..
    } = c;
    let id = d.id().to_owned();
    // Let go of the slot before the head hears of the output: it reuses a
    // preallocated slot as soon as it has it.
    d.release();
    let len = OUTPUT_SHAPE.iter().product::<u64>() as usize;
    let mut image = vec![0u8; len];
    data::fill(&mut image, n, OUTPUT_TENSOR);
    let meta = json!({
        "tensor_descriptors": [{
            "field_name": "output",
            "shape": OUTPUT_SHAPE,
            "dtype": "uint8",
            "list_index": -1,
        }],
        "scalar_fields": {"request_id": id},
    })
    .to_string();
    let sent = node.send_frames(&[meta.as_bytes(), &image]);
    tally.count(sent, |t| &mut t.outputs, "output_failed", &id);
}
