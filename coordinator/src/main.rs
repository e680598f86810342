fn main() {
    println!("coordinator");
}
