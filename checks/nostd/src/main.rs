//! Links tensorferry-core into a binary that has neither `std` nor an allocator,
//! then decodes, walks and re-encodes a message, allocates from a pool, and
//! runs a coordinator and two instances through a hand-off over tables on
//! its stack (`handoff`), to prove the code paths are really linked. Exit
//! status 0 means every check held; another names the check that failed.
#![no_std]
#![no_main]

mod handoff;

use core::panic::PanicInfo;

use tensorferry_core::slots::{Buddy, BuddyConfig};
use tensorferry_core::wire::{decode, Msg};

// The C runtime (crt1.o) calls `main`; libc provides memcpy and friends.
#[link(name = "c")]
extern "C" {}

#[panic_handler]
fn panic(_: &PanicInfo<'_>) -> ! {
    loop {}
}

const PAYLOAD: &[u8] = br#"{"msg_type":"transfer_staged","request_id":"r\u00e9","data_size":1024,"manifest":{"latents":[{"offset":0,"shape":[1,16,21,90,160],"dtype":"bfloat16"}]},"session_id":"s","pool_ptr":4096,"slot_offset":512,"scalar_fields":{"cfg":1e-05,"x":NaN}}"#;

fn check() -> Result<(), i32> {
    let msg = decode(PAYLOAD).map_err(|_| 1)?;
    let Msg::Staged(staged) = msg else {
        return Err(2);
    };
    let mut tensors = 0;
    for entry in staged.manifest.iter() {
        let entry = entry.map_err(|_| 3)?;
        if entry.shape.elements() != Some(16 * 21 * 90 * 160) {
            return Err(4);
        }
        tensors += 1;
    }
    let mut id = [0u8; 8];
    if tensors != 1 || staged.request_id.unescape_into(&mut id) != Ok("ré") {
        return Err(5);
    }
    let mut out = [0u8; 512];
    let n = msg.encode_canonical(&mut out).map_err(|_| 6)?;
    if &out[..n] != PAYLOAD {
        return Err(7);
    }
    check_slots()
}

/// A buddy allocator over stack storage: 64 MiB pool, 1 MiB blocks.
fn check_slots() -> Result<(), i32> {
    let config = BuddyConfig {
        pool_size: 64 << 20,
        min_block: 1 << 20,
        pool_id: 1,
    };
    let (mut tree, mut generations) = ([0u8; 127], [0u32; 64]);
    let mut pool = Buddy::new(config, &mut tree, &mut generations).map_err(|_| 10)?;
    let a = pool.allocate(3 << 20).map_err(|_| 11)?;
    let b = pool.allocate(1).map_err(|_| 12)?;
    if (a.offset(), a.size(), b.offset()) != (0, 4 << 20, 4 << 20) {
        return Err(13);
    }
    pool.free(a).map_err(|_| 14)?;
    pool.free(b).map_err(|_| 15)?;
    if pool.largest_free() != 64 << 20 {
        return Err(16);
    }
    handoff::check()
}

#[no_mangle]
pub extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    match check() {
        Ok(()) => 0,
        Err(code) => code,
    }
}
