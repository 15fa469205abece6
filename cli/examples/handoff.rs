//! One hand-off of a request from an encoder to a denoiser, as the control
//! messages that carry it: each built with tensorferry-core's types, encoded into a
//! caller buffer exactly as the seed's Python would encode it, framed as
//! `[b"__transfer__", json]`, then read back by the receiving side.
//!
//! `cargo run --release --example handoff`

use std::process::ExitCode;

use tensorferry::core::json::RawJson;
use tensorferry::core::wire::*;

/// Encodes `msg` into `buf` and frames it; returns the frames.
fn frame<'b>(msg: &Msg<'_>, buf: &'b mut [u8]) -> Result<[&'b [u8]; 2], BufferTooSmall> {
    let n = msg.encode(buf)?;
    Ok([TRANSFER_MAGIC, &buf[..n]])
}

fn main() -> ExitCode {
    const POOL_R: u64 = 0x7f00_0000_0000;
    let slots = [PreallocatedSlot {
        offset: 0,
        size: 32 << 20,
        slot_id: 0,
        addr: POOL_R,
    }];
    let tensors = [
        TensorEntry {
            field: "prompt_embeds".into(),
            list_index: None,
            offset: 0,
            shape: Shape::Dims(&[1, 512, 4096]),
            dtype: "bfloat16".into(),
        },
        TensorEntry {
            field: "latents".into(),
            list_index: Some(0),
            offset: 4 << 20,
            shape: Shape::Dims(&[1, 16, 21, 90, 160]),
            dtype: "bfloat16".into(),
        },
    ];
    let scalars = match RawJson::parse_object(
        r#"{"prompt":"a red fox in the snow","num_inference_steps":50,"guidance_scale":5.0}"#,
    ) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("scalar fields: {e}");
            return ExitCode::FAILURE;
        }
    };
    let data_size = (4 << 20) + 2 * 16 * 21 * 90 * 160;
    let handoff = [
        (
            "denoiser → coordinator",
            Msg::Register(Register {
                role: "denoiser".into(),
                session_id: "shm:ferry-denoiser-0".into(),
                pool_ptr: POOL_R,
                pool_size: 1 << 30,
                work_endpoint: "ipc:///tmp/ferry-denoiser-0".into(),
                preallocated_slots: SlotList::Slots(&slots),
                write_lifetime_ms: 0,
            }),
        ),
        (
            "coordinator → denoiser",
            Msg::RegisterAck(RegisterAck {
                session_id: "shm:ferry-denoiser-0".into(),
                role: "denoiser".into(),
                ..RegisterAck::default()
            }),
        ),
        (
            "encoder → coordinator",
            Msg::Staged(Staged {
                request_id: "req-1".into(),
                data_size,
                manifest: Manifest::Entries(&tensors),
                session_id: "shm:ferry-encoder-0".into(),
                pool_ptr: 0x7e00_0000_0000,
                slot_offset: 64 << 20,
                scalar_fields: scalars,
            }),
        ),
        (
            "coordinator → encoder",
            Msg::Push(Push {
                request_id: "req-1".into(),
                dest_session_id: "shm:ferry-denoiser-0".into(),
                dest_addr: POOL_R,
                transfer_size: data_size,
            }),
        ),
        (
            "encoder → coordinator",
            Msg::Pushed(Pushed {
                request_id: "req-1".into(),
                ..Pushed::default()
            }),
        ),
        (
            "coordinator → denoiser",
            Msg::Ready(Ready {
                request_id: "req-1".into(),
                manifest: Manifest::Entries(&tensors),
                slot_offset: 0,
                scalar_fields: scalars,
                dest_session_id: "shm:ferry-denoiser-0".into(),
                prealloc_slot_id: None,
            }),
        ),
        (
            "denoiser → coordinator",
            Msg::Done(Done {
                request_id: "req-1".into(),
                error: None,
                ..Done::default()
            }),
        ),
    ];
    let mut buf = [0u8; 1024];
    for (leg, msg) in &handoff {
        let frames = match frame(msg, &mut buf) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{}: {e}", msg.msg_type());
                return ExitCode::FAILURE;
            }
        };
        // The receiving side: recognise the frame, decode it borrowed.
        let Some(payload) = transfer_payload(&frames) else {
            eprintln!("not a transfer frame");
            return ExitCode::FAILURE;
        };
        match decode(payload) {
            Ok(back) if back == *msg => {
                println!("{leg:<24} {}", String::from_utf8_lossy(payload));
            }
            Ok(back) => {
                eprintln!("{}: decoded {back:?}, sent {msg:?}", msg.msg_type());
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("{}: {e}", msg.msg_type());
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "\n{} messages, each decoded back to what was sent.",
        handoff.len()
    );
    ExitCode::SUCCESS
}
