fn main() {
    println!("validator");
}
