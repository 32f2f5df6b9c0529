(* A long-lived runner: one request per line on stdin, "CMO NONCE TIMEOUT_MS". For each it forks a
   child that loads the compiled harness with Dynlink (no link step, no exec), and replies with the
   child's tally lines, each prefixed "R ", then one line "E <how it ended>". The runner itself runs
   as an unprivileged uid under the parent's resource limits, which every child inherits. With
   --sweep (given only inside a new PID namespace, and ignored when running as root) it kills every
   other process of the uid after each job, so nothing a completion spawned outlives it. *)

let devnull = lazy (Unix.openfile "/dev/null" [ Unix.O_RDWR ] 0)

let child cmo nonce write_end =
  ignore (Unix.setsid ());
  let null = Lazy.force devnull in
  List.iter (fun fd -> Unix.dup2 ~cloexec:false null fd) [ Unix.stdin; Unix.stdout; Unix.stderr ];
  let channel = Unix.out_channel_of_descr write_end in
  Tally.pending := Some { Tally.nonce; channel };
  (try Dynlink.loadfile cmo
   with Dynlink.Error err ->
     output_string channel ("! " ^ Tally.printable (Dynlink.error_message err) ^ "\n");
     flush channel;
     Unix._exit 3);
  exit 0

let now () = Unix.gettimeofday ()

(* Reads the child's tally until end of file or the deadline; true when the deadline passed. *)
let collect fd deadline buffer =
  let chunk = Bytes.create 4096 in
  let rec loop () =
    let left = deadline -. now () in
    if left <= 0. then true
    else
      match Unix.select [ fd ] [] [] left with
      | [], _, _ -> true
      | _ -> (
          match Unix.read fd chunk 0 4096 with
          | 0 -> false
          | n ->
              if Buffer.length buffer < 1_000_000 then Buffer.add_subbytes buffer chunk 0 n;
              loop ())
      | exception Unix.Unix_error (Unix.EINTR, _, _) -> loop ()
  in
  loop ()

let rec reap pid =
  match Unix.waitpid [] pid with
  | _, status -> status
  | exception Unix.Unix_error (Unix.EINTR, _, _) -> reap pid

let sweep () =
  (try Unix.kill (-1) Sys.sigkill with Unix.Unix_error _ -> ());
  let rec reap_all () =
    match Unix.waitpid [ Unix.WNOHANG ] (-1) with
    | 0, _ -> ()
    | _ -> reap_all ()
    | exception Unix.Unix_error _ -> ()
  in
  reap_all ()

let run ~sweep_after cmo nonce timeout_ms =
  let read_end, write_end = Unix.pipe ~cloexec:true () in
  flush stdout;
  match Unix.fork () with
  | 0 -> child cmo nonce write_end
  | pid ->
      Unix.close write_end;
      let buffer = Buffer.create 256 in
      let timed_out = collect read_end (now () +. (float_of_int timeout_ms /. 1000.)) buffer in
      Unix.close read_end;
      if timed_out then (try Unix.kill (-pid) Sys.sigkill with Unix.Unix_error _ -> ());
      (try Unix.kill pid Sys.sigkill with Unix.Unix_error _ -> ());
      let status = reap pid in
      if sweep_after then sweep ();
      let ending =
        if timed_out then "timeout"
        else
          match status with
          | Unix.WEXITED code -> Printf.sprintf "exit %d" code
          | Unix.WSIGNALED signal | Unix.WSTOPPED signal -> Printf.sprintf "signal %d" signal
      in
      String.split_on_char '\n' (Buffer.contents buffer)
      |> List.iter (fun line -> if line <> "" then print_string ("R " ^ line ^ "\n"));
      print_string ("E " ^ ending ^ "\n");
      flush stdout

let () =
  (* kill (-1) reaches every process the uid may signal: never as root, whatever the caller asked. *)
  let sweep_after = Array.length Sys.argv > 1 && Sys.argv.(1) = "--sweep" && Unix.getuid () <> 0 in
  Sys.set_signal Sys.sigpipe Sys.Signal_ignore;
  (* Initialises Dynlink here, once, rather than in every child. Completions cannot name Unix or
     Dynlink although they are linked in: the checker's load path holds only the stdlib and Tally. *)
  ignore (Dynlink.all_units ());
  (* A small heap makes every fork cheaper. *)
  Gc.compact ();
  try
    while true do
      match String.split_on_char ' ' (input_line stdin) with
      | [ cmo; nonce; timeout_ms ] -> run ~sweep_after cmo nonce (int_of_string timeout_ms)
      | _ ->
          print_string "E bad-request\n";
          flush stdout
    done
  with End_of_file -> ()
