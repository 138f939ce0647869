//! Snapshot data: an envelope of the address book, then the state machine's own snapshot.

use crate::peer::members::Members;
use crate::raft::machine::StateMachine;

/// The snapshot envelope: `[u32 length][address book JSON][state machine snapshot]`.
pub fn envelope(members: &Members, machine: &[u8]) -> Vec<u8> {
    let book = serde_json::to_vec(members).expect("an address book serializes");
    let mut out = Vec::with_capacity(4 + book.len() + machine.len());
    out.extend_from_slice(&(book.len() as u32).to_be_bytes());
    out.extend_from_slice(&book);
    out.extend_from_slice(machine);
    out
}

/// The state machine and address book in snapshot data made by [`envelope`].
pub fn restore<M: StateMachine>(data: &[u8]) -> Result<(M, Option<Members>), String> {
    let len = data
        .get(..4)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or("snapshot: short data")?;
    let book = data
        .get(4..4 + len)
        .ok_or("snapshot: address book past the end")?;
    let members =
        serde_json::from_slice(book).map_err(|e| format!("snapshot: bad address book: {e}"))?;
    Ok((M::restore(&data[4 + len..])?, Some(members)))
}
