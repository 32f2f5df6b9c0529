(* The one channel a test harness reports through. The runner fills [pending] and [sealing] before it
   loads a harness. The harness's first item calls [seal], which runs [sealing]: the runner's child then
   removes the compiled unit from the file system and drops to the test uid, before any code of the
   problem or of the completion runs. The harness takes the token before it applies the completion's
   functor, so the completion can neither obtain the token nor learn the nonce that the parent requires
   on every result line. *)

type token = { nonce : string; channel : out_channel }

let pending : token option ref = ref None
let sealing : (unit -> unit) ref = ref (fun () -> failwith "Tally.seal: no runner")
let sealed = ref false

(* Once: a completion that calls it again gets nothing done. *)
let seal () =
  if not !sealed then begin
    let run = !sealing in
    sealing := ignore;
    run ();
    sealed := true
  end

let take () =
  match !pending with
  | Some token when !sealed ->
      pending := None;
      token
  | _ -> failwith "Tally.take: already taken or not sealed"

(* Exception texts are chosen by the completion: one short printable line. *)
let printable text =
  let text = if String.length text > 160 then String.sub text 0 160 else text in
  String.map (fun c -> if c < ' ' || c > '~' then '?' else c) text

let describe exn = match Printexc.to_string exn with text -> printable text | exception _ -> "?"

(* One assertion: its verdict is written and flushed before the next one runs, so a later timeout
   or exit keeps the credit already earned. *)
let check token index assertion =
  let verdict =
    match assertion () with
    | () -> "pass"
    | exception Assert_failure _ -> "fail"
    | exception exn -> "exn " ^ describe exn
  in
  output_string token.channel (Printf.sprintf "%s %d %s\n" token.nonce index verdict);
  flush token.channel
